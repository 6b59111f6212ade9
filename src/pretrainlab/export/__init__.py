"""Exported encoders: the native format fine-tuning loads (native.py), the Hugging Face format both
ways (hf.py), and the command line (``python -m pretrainlab.export``, __main__.py).

    from pretrainlab.export import load_encoder
    encoder, tokenizer, meta = load_encoder("runs/<run>")     # or runs/<run>/encoder
"""

from pretrainlab.export.native import ExportError, export_encoder, load_encoder, resolve_export_dir

__all__ = ["ExportError", "export_encoder", "load_encoder", "resolve_export_dir"]
