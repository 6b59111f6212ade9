"""Start a study's processes without importing torch and Lightning in each: a fork server.

A process of a study (a pretraining run, an evaluation suite, a slot's calibration job) spends its
first seconds importing torch, Lightning, W&B and this package: about 10 s of CPU on a 2-core machine,
more than many of its runs' training on a CPU, and a slot starts tens of them. :class:`ForkServer` starts
one interpreter that imports all of that once, and forks each process from it: the same
``python -m <module> <args>`` (or ``python <script.py> <args>``) in the study's environment and working
directory, with its output in its log (or its standard output and error in two), in a session of its own,
its exit status reported as a process's. The server is a fresh interpreter
that has only imported (no CUDA, no threads, nothing of the study's process); a process forked from a
server in which CUDA was initialized anyway starts a fresh interpreter in its place.

A process forked from a server does not start a server of its own when the one it came from imported what
it needs: it forks its processes from that one, through the server's socket (a folder only this user can
read). A study or a slot that was itself forked (tests/conftest.py forks the commands the tests run) then
starts its runs without a second interpreter's imports. Only the forked process knows the socket: a
process it starts afresh (a DDP rank, a SLURM job) starts its own.

    server = ForkServer()
    with server:
        proc = server.popen(["-m", "pretrainlab.studies.parallel", "spec.yaml"], log, env, cwd)
        proc.poll(); proc.send_signal(signal.SIGTERM); proc.wait()

    server = shared()   # this process's server, kept for all its phases (a study's pretraining, then its
                        # evaluations; a slot's calibration, runs and evaluations), stopped when it exits
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO

from pretrainlab.runtime.early import WANDB_MODULES

# what a study's process imports: what its runs import when they start (W&B's run, first: runtime.early), the
# work's own module (torch, Lightning, the package), the learning report's tables, the data pipeline's arrow files
PRELOAD = (*WANDB_MODULES, "pretrainlab.studies.parallel", "pretrainlab.data.arrow", "pandas")


class ForkServerError(RuntimeError):
    pass


class Forked:
    """A process the server forked, with what the study uses of :class:`subprocess.Popen`."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended since: its status is on its way
                pass


class ForkServer:
    """The client's side: starts the server (:func:`serve` in a fresh interpreter) on first use,
    forks processes from it, and stops it when closed (after the processes it forked have ended)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD):
        self.preload = preload
        self._proc: subprocess.Popen | None = None
        self._conn: socket.socket | None = None  # to the server this process was forked from (_ORIGIN)
        self._requests: IO[bytes] | None = None  # the server's input: its standard input, or the connection
        self._ended = threading.Event()  # the server's answers have ended
        self._folder: str | None = None  # the folder of the socket of the server this process started
        self._messages: queue.Queue = queue.Queue()
        self._forked: dict[int, Forked] = {}
        self._lock = threading.RLock()
        self._ready = False

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the server (it imports while the caller goes on; :meth:`popen` waits for it), or connect to
        the one this process was forked from where that one imported ``preload``."""
        if self._requests is not None:
            return
        if _ORIGIN is not None and set(self.preload) <= set(_ORIGIN[1]):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(_ORIGIN[0])
            except OSError:  # it has ended: a server of this process's own
                conn.close()
            else:
                self._conn, self._requests = conn, conn.makefile("wb")
                threading.Thread(target=self._read, args=(conn.makefile("rb"),), daemon=True).start()
                return
        self._folder = tempfile.mkdtemp(prefix="pretrainlab-forkserver-")  # its socket's: only this user's
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, self._folder, *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the study, not the server
        )
        self._requests = self._proc.stdin
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()

    def alive(self) -> bool:
        """Not started yet, or running."""
        if self._proc is not None:
            return self._proc.poll() is None
        return not self._ended.is_set()

    def _read(self, stream) -> None:
        for line in stream:
            try:
                self._messages.put(json.loads(line))
            except ValueError:  # not an answer: something the server printed, shown as it is
                sys.stderr.write(line.decode(errors="replace"))
        self._ended.set()
        self._messages.put({"closed": True})

    def _next(self, block: bool) -> dict | None:
        try:
            message = self._messages.get(block=block, timeout=None)
        except queue.Empty:
            return None
        if "closed" in message:
            for forked in self._forked.values():  # no more news of them: they were the server's children
                if forked.returncode is None:
                    forked.returncode = -signal.SIGKILL
            if self._proc is None:
                raise ForkServerError("the fork server this process was forked from has ended")
            code = self._proc.wait()
            self._remove_folder()
            raise ForkServerError(
                f"the fork server (pretrainlab.studies.forkserver.serve) ended with exit status {code}"
            )
        if "exited" in message:
            self._forked[message["exited"]].returncode = message["status"]
        return message

    def _collect(self) -> None:
        with self._lock:
            while self._next(block=False) is not None:
                pass

    def popen(
        self, args: list[str], log: str | Path, env: dict[str, str], cwd: str | Path, stderr: str | Path | None = None
    ) -> Forked:
        """``python <args>`` (``-m <module> ...`` or ``<script.py> ...``), forked: ``env`` its environment,
        ``cwd`` its working directory, its output appended to ``log`` (its standard error to ``stderr``
        when given)."""
        if not ((args[:1] == ["-m"] and len(args) >= 2) or (args and str(args[0]).endswith(".py"))):
            raise ValueError(f"{args}: a fork server starts `-m <module> <args>` or `<script.py> <args>`")
        self.start()
        assert self._requests is not None
        with self._lock:
            while not self._ready:
                message = self._next(block=True)
                self._ready = bool(message and "ready" in message)
            # paths as this process reads them: the server's working directory may be another's
            request = {"args": [str(a) for a in args], "log": os.path.abspath(log), "env": dict(env)}
            request["cwd"] = os.path.abspath(cwd)
            if stderr is not None:
                request["stderr"] = os.path.abspath(stderr)
            self._requests.write((json.dumps(request) + "\n").encode())
            self._requests.flush()
            while True:
                message = self._next(block=True)
                if message and "forked" in message:
                    forked = Forked(self, message["forked"], [sys.executable, *args])
                    self._forked[forked.pid] = forked
                    return forked

    def close(self) -> None:
        """Stop the server: at once when every process it forked has ended (a server still importing is
        not waited for: a study stopped by its time limit or a signal stops now), else once they have
        (closing its input tells it to). Connected to the server this process was forked from: disconnect
        (that server goes on for the others, and its processes run to their end)."""
        if self._requests is None:
            return
        try:
            self._collect()
        except ForkServerError:  # it has ended already
            pass
        try:
            self._requests.close()
        except OSError:
            pass
        self._requests = None
        if self._conn is not None:
            try:
                self._conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._conn.close()
            self._conn = None
            return
        assert self._proc is not None
        if all(f.returncode is not None for f in self._forked.values()):
            self._proc.kill()
        self._proc.wait()
        self._proc = None
        self._remove_folder()

    def _remove_folder(self) -> None:
        """The socket's folder of a server that has ended (removed by it too, unless it was killed)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


_SHARED: dict[tuple[str, ...], ForkServer] = {}
# the server: serve(preload, folder) in this module (not a second copy of it as __main__), so that the
# processes it forks find their origin in the module their own ForkServer reads
_SERVE = "import sys\nfrom pretrainlab.studies.forkserver import serve\nserve(sys.argv[2:], sys.argv[1])"
# in a process a server forked: (its socket, what it was asked to import); None in any other
_ORIGIN: tuple[str, tuple[str, ...]] | None = None


def shared(preload: tuple[str, ...] = PRELOAD) -> ForkServer:
    """This process's server for ``preload``: started on first use and kept for every later one (each server
    costs a fresh interpreter's imports, 10-15 s of CPU, and a study or a slot forks processes in several
    phases), stopped when the process exits; a server that has ended is replaced. A process forked from this
    one (the server's own children) starts with none."""
    server = _SHARED.get(preload)
    if server is None or not server.alive():
        server = _SHARED[preload] = ForkServer(preload)
    return server


@atexit.register
def _close_shared() -> None:
    while _SHARED:
        _SHARED.popitem()[1].close()


def _forget_servers() -> None:
    """In a process forked from this one: no server of its parent's (nor the one its parent came from)."""
    global _ORIGIN
    _SHARED.clear()
    _ORIGIN = None


os.register_at_fork(after_in_child=_forget_servers)


# --- the server ---


def _exit_code(code: object) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run_child(request: dict, private: list[int], origin: tuple[str, tuple[str, ...]]) -> None:
    """In the forked process: become ``python <args>`` as a fresh interpreter would, then exit. ``origin``
    (the server's socket, what it imported) is where this process's own :class:`ForkServer` forks from."""
    code = 1
    try:
        for fd in private:  # the server's pipes to the study, its socket and its other clients
            os.close(fd)
        global _ORIGIN
        _ORIGIN = origin
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, request["log"]), (2, request.get("stderr", request["log"]))):
            out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(out, fd)
            os.close(out)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        args = request["args"]
        # python -m puts its working directory first on the path, python <script> the script's folder
        sys.path[0] = request["cwd"] if args[0] == "-m" else os.path.dirname(os.path.abspath(args[0]))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        torch = sys.modules.get("torch")  # imported by the server, or by the process itself (below) as usual
        if torch is not None and torch.cuda._is_in_bad_fork():  # CUDA initialized in the server: start afresh
            os.execv(sys.executable, [sys.executable, *args])
        if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():  # read at a fresh start
            torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
        _own_what_imports_made()  # not before an exec above: its folders would never be removed
        import runpy

        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.modules.pop(args[1], None)  # as under python -m: the module runs as __main__, not a second time
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        code = _shutdown(code)
        os._exit(code)


def _own_what_imports_made() -> None:
    """In a forked process: what the server's imports made is the server's to clean up, not each child's
    at its exit, and a temporary folder one of them made (W&B's media folder, made when W&B is imported)
    is made anew for the child, as a fresh interpreter would have, and removed when it exits. Shared, the
    first child to end removed it from under the others, and their W&B tables failed ("No such file or
    directory: .../wandb-media/...table.json")."""
    import atexit

    for made in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        made.atexit = False
        found = made.peek()
        if found is not None and isinstance(found[0], tempfile.TemporaryDirectory):
            folder = found[0]
            folder.name = tempfile.mkdtemp(prefix=f"{os.path.basename(folder.name)}-{os.getpid()}-")
            atexit.register(shutil.rmtree, folder.name, ignore_errors=True)


def _shutdown(code: int) -> int:
    """An interpreter's exit: wait for its threads, run its atexit functions, flush its output."""
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return code


class _Client:
    """Who asks the server for processes: the study on its standard input and output, or a process the
    server forked, on a connection to its socket."""

    def __init__(self, read: int, write: int):
        self.read, self.write, self.buffer, self.gone = read, write, b"", False

    def answer(self, message: dict) -> None:
        if self.gone:
            return
        try:
            os.write(self.write, (json.dumps(message) + "\n").encode())
        except OSError:  # it has gone: the news of its processes is nobody's
            self.gone = True


def serve(preload: list[str], folder: str) -> None:
    """Import ``preload`` (a module that is not installed is skipped), then fork a process for each
    request on standard input or on a connection to its socket (one JSON line: args, log, env, cwd),
    answering ``{"forked": pid}``, and ``{"exited": pid, "status": code}`` when it ends; on end of standard
    input, wait for them (serving those still connected) and exit. Its socket is in ``folder`` (the client's,
    only this user's), which it removes at its end."""
    import importlib
    import selectors

    requests, answers = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # what an import prints goes to the study's console, never into the answers
    loaded = []
    for name in preload:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    origin = (path, tuple(preload))
    ready = {"ready": loaded}

    study = _Client(requests, answers)
    clients = {requests: study}
    owner: dict[int, _Client] = {}
    study.answer(ready)
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(listener, selectors.EVENT_READ)
    open_input = True
    try:
        while open_input or owner:
            for key, _ in selector.select(timeout=0.1):
                if key.fileobj is listener:
                    fd = listener.accept()[0].detach()
                    clients[fd] = _Client(fd, fd)
                    selector.register(fd, selectors.EVENT_READ)
                    clients[fd].answer(ready)
                    continue
                client = clients[key.fd]
                try:
                    chunk = os.read(client.read, 65536)
                except OSError:
                    chunk = b""
                if not chunk:  # it closed: the study's end of input, or a process that disconnected
                    selector.unregister(client.read)
                    del clients[client.read]
                    if client is study:
                        open_input = False
                    else:
                        client.gone = True
                        os.close(client.read)
                    continue
                client.buffer += chunk
                while b"\n" in client.buffer:
                    line, client.buffer = client.buffer.split(b"\n", 1)
                    request = json.loads(line)
                    private = [requests, answers, listener.fileno(), selector.fileno()]
                    private += [fd for fd in clients if fd != requests]
                    pid = os.fork()
                    if pid == 0:
                        _run_child(request, private, origin)
                    owner[pid] = client
                    client.answer({"forked": pid})
            while owner:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                owner.pop(pid).answer({"exited": pid, "status": os.waitstatus_to_exitcode(status)})
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
