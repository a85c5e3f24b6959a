# Sandcell's Python kernel: one interpreter holding one context's state.
# Speaks crates/sandcell-kernels/PROTOCOL.md over two inherited pipes. Standard library only;
# matplotlib and pandas are used only when the user's code has imported them. Start-up time is
# a cold run's latency, so heavy modules are imported on first use (asyncio ~30 ms, codeop,
# linecache and with it tokenize and re), JSON goes through the C accelerator without the
# `json` package (which imports re, enum, functools and collections: ~8 ms), and signals,
# threads and locks come from `_signal` and `_thread` (`signal` imports enum: ~4 ms).
import _ast
import _signal
import _thread
import builtins
import io
import math
import os
import sys
import time


# Started with `python3 -S`: what the `site` module does at start-up (reading .pth files,
# user site-packages, sitecustomize) is half of Python's start-up here (~7 of ~15 ms). The
# site directories are put on sys.path now, as `site` would; the rest runs the first time an
# import finds nothing on the paths there are, and that import then looks again.
def _add_site_dirs():
    import site

    for d in site.getsitepackages() + [site.getusersitepackages()]:
        if d not in sys.path and os.path.isdir(d):
            sys.path.append(d)


class _SiteOnFirstMiss:
    def find_spec(self, fullname, path=None, target=None):
        if path is not None:
            # A submodule: its package's own path decides.
            return None
        sys.meta_path.remove(self)
        import site
        import importlib.machinery

        try:
            site.main()
        except Exception:
            pass
        return importlib.machinery.PathFinder.find_spec(fullname)


if sys.flags.no_site:
    _add_site_dirs()
    sys.meta_path.append(_SiteOnFirstMiss())

_CTL = int(os.environ["SANDCELL_KERNEL_CTL_FD"])
_EVENTS = int(os.environ["SANDCELL_KERNEL_EVENT_FD"])
os.set_inheritable(_CTL, False)
os.set_inheritable(_EVENTS, False)
_LIMIT = int(os.environ.get("SANDCELL_STREAM_LIMIT", "1048576") or 1048576)
_CELL_PREFIX = "<cell "
_FLUSH_SECONDS = 0.02
_BATCH_BYTES = 65536

_ctl = os.fdopen(_CTL, "rb", buffering=65536)
# Held by whoever reads `_ctl` (the main loop, or a thread waiting for a host call's answer):
# a buffered reader must never be read by two threads at once (it finds a line already
# buffered without its own lock, so two readers could each take part of one).
_ctl_lock = _thread.allocate_lock()
_events_lock = _thread.allocate_lock()


def _json_codec():
    """dumps(obj) and loads(text) with repr() for what JSON cannot hold; the C accelerator
    when there is one (CPython), else the json package."""
    try:
        import _json
    except ImportError:
        _json = None
    if _json is None or not hasattr(_json, "make_encoder"):
        import json

        return (lambda obj: json.dumps(obj, ensure_ascii=True, default=repr)), json.loads

    class Context:  # what the C scanner reads from a json.JSONDecoder
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.__getitem__
        memo = {}

    scan = _json.make_scanner(Context())

    def dumps(obj):
        # As json.dumps(obj, ensure_ascii=True, default=repr): one-shot, ", " and ": ".
        encode = _json.make_encoder(
            {}, repr, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
        return "".join(encode(obj, 0))

    def loads(text):
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        text = text.strip(" \t\r\n")
        try:
            obj, end = scan(text, 0)
        except StopIteration:
            raise ValueError("expected a JSON value") from None
        except SystemError:
            # The scanner reports bad JSON with json.decoder's error class, which it finds
            # only once imported (else it fails like this): import it, and look again.
            import json.decoder  # noqa: F401

            obj, end = scan(text, 0)
        if end != len(text):
            raise ValueError("extra data after the JSON value at %d" % end)
        return obj

    return dumps, loads


_json_dumps, _json_loads = _json_codec()


def _emit(msg):
    """Writes one event line. A SIGINT meanwhile is held back until the line is out, so the
    event stream is never cut mid-line."""
    outer = _state.emitting
    _state.emitting = True
    try:
        line = (_json_dumps(msg) + "\n").encode("ascii")
        with _events_lock:
            _write_all(line)
    finally:
        _state.emitting = outer
    if not outer and _state.interrupt_pending and _state.running_user_code:
        _state.interrupt_pending = False
        raise KeyboardInterrupt


def _write_all(data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(_EVENTS, view)
        except InterruptedError:
            continue
        view = view[n:]


class _State:
    """The kernel's own bookkeeping, kept out of the user's globals."""

    request = None  # id of the execution running, or None
    running_user_code = False
    emitting = False
    interrupt_pending = False
    count = 0
    loop = None
    pyplot_patched = False


_state = _State()


# ------------------------------------------------------------------------------------------
# Streams


class _Stream(io.TextIOBase):
    """sys.stdout / sys.stderr: text goes out as `stream` events, batched and capped."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self._parts = []
        self._size = 0
        self._first = 0.0  # when the oldest buffered text was written
        self.sent = 0
        self.dropped = 0
        self._lock = _thread.RLock()
        self.buffer = _BinaryStream(self)

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        # Code that asks (subprocess, faulthandler) gets the real descriptor.
        return 1 if self.name == "stdout" else 2

    def reset(self):
        with self._lock:
            self._parts, self._size, self.sent, self.dropped = [], 0, 0, 0

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        n = len(s)
        with self._lock:
            if _state.request is None:
                # Between executions (a thread printing late): drop quietly.
                return n
            room = _LIMIT - self.sent - self._size
            if room <= 0:
                self.dropped += len(s.encode("utf-8", "replace"))
                return n
            data = s
            if len(data) > room:
                # Counted in characters here, bytes below: close enough for a cap.
                self.dropped += len(data[room:].encode("utf-8", "replace"))
                data = data[:room]
            if not self._parts:
                self._first = time.monotonic()
            self._parts.append(data)
            self._size += len(data)
            if self._size + self.sent >= _LIMIT:
                self._flush_locked()
                self._parts.append(
                    "\n[sandcell: output truncated after %d bytes]\n" % _LIMIT
                )
                self._flush_locked(count=False)
            elif self._size >= _BATCH_BYTES or time.monotonic() - self._first > _FLUSH_SECONDS:
                self._flush_locked()
        return n

    def flush(self):
        with self._lock:
            self._flush_locked()

    def flush_if_old(self):
        """Sends text that has waited longer than the batching interval."""
        with self._lock:
            if self._parts and time.monotonic() - self._first >= _FLUSH_SECONDS:
                self._flush_locked()

    def _flush_locked(self, count=True):
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts, self._size = [], 0
        if count:
            self.sent += len(text)
        if _state.request is not None:
            _emit({"type": "stream", "id": _state.request, "name": self.name, "text": text})


class _BinaryStream(io.RawIOBase):
    """sys.stdout.buffer: bytes are decoded (invalid ones replaced) and sent as text."""

    def __init__(self, text):
        super().__init__()
        self._text = text

    def writable(self):
        return True

    def write(self, b):
        self._text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    def flush(self):
        self._text.flush()


_stdout = _Stream("stdout")
_stderr = _Stream("stderr")


# Held by the main thread while no cell runs, so the flusher below sleeps on it (a lock may
# be released by any thread, unlike threading's).
_idle = _thread.allocate_lock()
_idle.acquire()


def _flusher():
    """Sends batched text of a long-running cell after at most ~2 batching intervals; idle
    while no cell runs."""
    while True:
        _idle.acquire()
        _idle.release()
        time.sleep(_FLUSH_SECONDS)
        if _state.request is not None:
            try:
                _stdout.flush_if_old()
                _stderr.flush_if_old()
            except Exception:
                pass


_thread.start_new_thread(_flusher, ())


def _flush_streams():
    _stdout.flush()
    _stderr.flush()


# ------------------------------------------------------------------------------------------
# Rich output

_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
)


def _call_repr(method):
    try:
        value = method()
    except Exception:
        return None, None
    if isinstance(value, tuple) and len(value) == 2:
        return value
    return value, None


def _bundle(obj):
    """The MIME bundle and metadata of an object."""
    data, metadata = {}, {}
    if _is_figure(obj):
        png = _figure_png(obj)
        if png:
            data["image/png"] = png
    mimebundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(mimebundle) and not isinstance(obj, type):
        try:
            got = mimebundle()
            if isinstance(got, tuple):
                got, meta = got
                metadata.update(meta or {})
            if isinstance(got, dict):
                for mime, value in got.items():
                    data[mime] = _encode(mime, value)
        except Exception:
            pass
    if not isinstance(obj, type):
        for mime, name in _REPR_METHODS:
            if mime in data:
                continue
            method = getattr(obj, name, None)
            if not callable(method):
                continue
            value, meta = _call_repr(method)
            if value is None:
                continue
            data[mime] = _encode(mime, value)
            if meta:
                metadata[mime] = meta
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<repr failed: %s>" % e
    return data, metadata


def _b64(data):
    import base64

    return base64.b64encode(bytes(data)).decode("ascii")


def _encode(mime, value):
    if isinstance(value, (bytes, bytearray)):
        return _b64(value)
    if mime == "application/json":
        return value
    if mime in ("image/png", "image/jpeg") and isinstance(value, str):
        return value  # already base64
    return value if isinstance(value, str) else str(value)


def display(*objs, **kwargs):
    """Shows objects as rich output, in order."""
    raw = kwargs.get("raw", False)
    for obj in objs:
        if raw and isinstance(obj, dict):
            data, metadata = obj, {}
        else:
            data, metadata = _bundle(obj)
        _send_rich("display", data, metadata)


def _send_rich(kind, data, metadata):
    if _state.request is None:
        return
    _flush_streams()
    _emit({"type": kind, "id": _state.request, "data": data, "metadata": metadata or {}})


# ------------------------------------------------------------------------------------------
# matplotlib


def _pyplot():
    return sys.modules.get("matplotlib.pyplot")


def _is_figure(obj):
    fig = sys.modules.get("matplotlib.figure")
    return fig is not None and isinstance(obj, fig.Figure)


def _figure_png(fig):
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return _b64(buf.getvalue())
    except Exception:
        return None


def _show_figures(*_args, **_kwargs):
    """Sends every open figure as a PNG display and closes it (also `plt.show()`)."""
    plt = _pyplot()
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        png = _figure_png(fig)
        if png:
            _send_rich(
                "display",
                {"image/png": png, "text/plain": repr(fig)},
                {},
            )
        plt.close(fig)


def _patch_pyplot():
    plt = _pyplot()
    if plt is None or _state.pyplot_patched:
        return
    _state.pyplot_patched = True
    plt.show = _show_figures
    try:
        plt.ioff()
    except Exception:
        pass


class _AfterImport:
    """Runs a kernel hook the moment a module is imported (by anyone): pyplot gets its `show`
    patched, so a `show()` in the same cell already sends its figures; linecache gets the
    cells' sources, so tracebacks show their lines."""

    def find_spec(self, fullname, path=None, target=None):
        hook = _AFTER_IMPORT.get(fullname)
        if hook is None:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            hook()

        loader.exec_module = exec_module
        return spec


# Sources of the cells run so far, by their file name ("<cell N>").
_cells = {}


def _remember_cell(name, code):
    _cells[name] = code
    if "linecache" in sys.modules:
        _fill_linecache()


def _fill_linecache():
    cache = sys.modules["linecache"].cache
    for name, code in _cells.items():
        # mtime None: linecache never checks these against a file.
        cache.setdefault(name, (len(code), None, code.splitlines(True), name))


_AFTER_IMPORT = {"matplotlib.pyplot": _patch_pyplot, "linecache": _fill_linecache}
sys.meta_path.insert(0, _AfterImport())


# ------------------------------------------------------------------------------------------
# Interrupts: SIGINT raises KeyboardInterrupt only inside user code.


def _on_sigint(_signum, _frame):
    if _state.running_user_code and not _state.emitting:
        raise KeyboardInterrupt
    # Idle, or inside the kernel's own work: remember it only while an execution runs.
    if _state.request is not None:
        _state.interrupt_pending = True


_signal.signal(_signal.SIGINT, _on_sigint)


# ------------------------------------------------------------------------------------------
# Execution

_user = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
builtins.display = display
_KERNEL_NAMES = {"display"}


# ------------------------------------------------------------------------------------------
# Host calls (PROTOCOL.md "Host calls"): code asks the host something and blocks for the
# answer, over the pipes the kernel already has. The host does the work (a model call) and
# sends back only the answer: no network and no key in the sandbox. Defined always; without a
# host that answers them (plain run_code) they raise SandcellHostCallError.


class SandcellHostCallError(Exception):
    """A call from the code to the host got no answer (no host serves it, it failed)."""

    kind = "failed"


class SandcellBudgetError(SandcellHostCallError):
    """The run's budget (sub-calls, tokens, cost, depth, time) does not allow the call."""


class SandcellCancelledError(SandcellHostCallError):
    """The run was cancelled (or the cell ended) before the host answered."""


for _cls in (SandcellHostCallError, SandcellBudgetError, SandcellCancelledError):
    # Shown and pickled as builtins (they are kept there), never as the kernel's __main__.
    _cls.__module__ = "builtins"
del _cls


class _HostCalls:
    """Host calls waiting for their answers. While a cell runs only `host_reply` lines arrive
    on the request pipe, and one waiting thread of that cell at a time reads it, filing what
    it reads for whichever call it answers; between cells the main loop reads the pipe and
    files them the same way (a thread left over from an ended cell waits for that)."""

    next = 0
    reading = False
    waiting = set()
    replies = {}
    cond = None


_hc = _HostCalls()
_hc_make_lock = _thread.allocate_lock()


def _hc_cond():
    if _hc.cond is None:
        with _hc_make_lock:
            if _hc.cond is None:
                import threading

                _hc.cond = threading.Condition()
    return _hc.cond


def _host_call(method, payload):
    """Sends a `host_call` event for the running cell and waits for its `host_reply`."""
    rid = _state.request
    if rid is None:
        raise SandcellHostCallError("%s works only while a cell runs" % method)
    cond = _hc_cond()
    with cond:
        _hc.next += 1
        call = _hc.next
        _hc.waiting.add(call)
    try:
        _emit({"type": "host_call", "id": rid, "call": call, "method": method, "payload": payload})
        reply = _hc_wait(cond, call, rid)
    finally:
        with cond:
            _hc.waiting.discard(call)
            _hc.replies.pop(call, None)
    error = reply.get("error")
    if error is not None:
        if not isinstance(error, dict):
            error = {"message": str(error)}
        kind = error.get("kind") or "failed"
        cls = {"budget": SandcellBudgetError, "cancelled": SandcellCancelledError}.get(
            kind, SandcellHostCallError
        )
        exc = cls("%s: %s" % (method, error.get("message") or "the host call failed"))
        exc.kind = kind
        raise exc
    return reply.get("ok")


def _hc_wait(cond, call, rid):
    while True:
        # `line` is None while this thread is not the reader; set before `reading`, so an
        # interrupt at any point leaves no reader marked that is not reading.
        line = None
        try:
            with cond:
                while True:
                    if call in _hc.replies:
                        return _hc.replies.pop(call)
                    # Only while its cell runs: after that the main loop reads the pipe (and
                    # the agent has answered every call of the cell before the next request).
                    if not _hc.reading and _state.request == rid:
                        line = b""
                        _hc.reading = True
                        break
                    cond.wait()
            with _ctl_lock:
                line = _ctl.readline()
            if not line:
                raise SandcellHostCallError("the agent closed the kernel's request pipe")
        finally:
            if line is not None:
                with cond:
                    _hc.reading = False
                    _hc_file(line)
                    cond.notify_all()


def _hc_file(line):
    """Files a `host_reply` line for the call waiting for it; a reply nobody waits for (its
    call was interrupted) and anything else read here are dropped."""
    if not line:
        return
    try:
        msg = _json_loads(line)
    except ValueError:
        return
    if isinstance(msg, dict) and msg.get("op") == "host_reply":
        call = msg.get("call")
        if isinstance(call, int) and call in _hc.waiting:
            _hc.replies[call] = msg


def _hc_between_cells(req):
    """A `host_reply` the main loop read: for a thread of an ended cell, if one waits."""
    if _hc.cond is None:
        return
    call = req.get("call")
    if not isinstance(call, int):
        return
    with _hc.cond:
        if call in _hc.waiting:
            _hc.replies[call] = req
            _hc.cond.notify_all()


def _text(value, what):
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    return value


def llm_query(prompt):
    """Asks the run's model `prompt` (one sub-call, no tools); returns its answer."""
    answer = _host_call("llm_query", {"prompt": _text(prompt, "prompt")})
    return answer if isinstance(answer, str) else str(answer)


def llm_query_batched(prompts):
    """Asks the run's model every prompt at once (one host call, answered concurrently);
    returns the answers in order."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
        raise TypeError("prompts must be a list of str, not %s" % type(prompts).__name__)
    prompts = [_text(p, "prompts[%d]" % i) for i, p in enumerate(prompts)]
    if not prompts:
        return []
    answers = _host_call("llm_query_batched", {"prompts": prompts})
    if not isinstance(answers, list) or len(answers) != len(prompts):
        raise SandcellHostCallError("llm_query_batched: the host answered %r" % (answers,))
    return [a if isinstance(a, str) else str(a) for a in answers]


def rlm_query(prompt):
    """Hands `prompt` to a sub-run one level deeper (its own REPL, with `context` = the
    prompt); returns its answer. At the run's depth limit: a plain llm_query."""
    answer = _host_call("rlm_query", {"prompt": _text(prompt, "prompt")})
    return answer if isinstance(answer, str) else str(answer)


def FINAL(answer):
    """Gives the run's final answer; the run ends after this code block."""
    _host_call("final", {"answer": answer if isinstance(answer, str) else str(answer)})


def FINAL_VAR(name):
    """Gives the value of the variable named `name` as the run's final answer."""
    if not isinstance(name, str):
        raise TypeError(
            "FINAL_VAR takes the variable's name as a str (FINAL_VAR('answer')); "
            "to give a value, use FINAL(value)"
        )
    key = name.strip()
    if key not in _user:
        raise NameError("FINAL_VAR: no variable named %r" % key)
    value = _user[key]
    FINAL(value if isinstance(value, str) else str(value))


# Builtins, like `display`: never among the user's variables, and a user's own definition
# of one of these names simply shadows it.
for _f in (llm_query, llm_query_batched, rlm_query, FINAL, FINAL_VAR,
           SandcellHostCallError, SandcellBudgetError, SandcellCancelledError):
    setattr(builtins, _f.__name__, _f)
del _f


def _cell_name(n):
    return "%s%d>" % (_CELL_PREFIX, n)


def _compile_cell(code, name):
    """(body code object, last-expression code object or None). Uses the compiler's own AST
    (`_ast`), not the `ast` module, which costs milliseconds to import."""
    flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, name, "exec", flags=_ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(tree.body.pop().value)
    body = compile(tree, name, "exec", flags=flags, dont_inherit=True)
    expr = compile(last, name, "eval", flags=flags, dont_inherit=True) if last else None
    return body, expr


# inspect.CO_COROUTINE, types.CoroutineType and types.ModuleType, without importing them.
_CO_COROUTINE = 0x80
_ModuleType = type(sys)


async def _probe():
    pass


_coroutine = _probe()
_CoroutineType = type(_coroutine)
_coroutine.close()
del _probe, _coroutine


def _loop():
    import asyncio

    if _state.loop is None or _state.loop.is_closed():
        _state.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_state.loop)
    return _state.loop


def _run(code_obj):
    """Evaluates a code object in the user's globals, awaiting it if it is a coroutine."""
    result = eval(code_obj, _user)
    if code_obj.co_flags & _CO_COROUTINE:
        result = _loop().run_until_complete(result)
    return result


def _user_traceback(exc):
    """Traceback lines that show the user's code, never the kernel's own frames."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.startswith(_CELL_PREFIX):
        # A cell that does not compile: the compiler's own frames mean nothing to the user.
        return [l.rstrip("\n") for l in traceback.format_exception_only(type(exc), exc)]
    frames = traceback.extract_tb(exc.__traceback__)
    kept = [f for f in frames if not _is_kernel_frame(f.filename)]
    lines = ["Traceback (most recent call last):"] if kept else []
    for line in traceback.format_list(kept):
        lines.extend(line.rstrip("\n").split("\n"))
    lines.extend(
        l.rstrip("\n") for l in traceback.format_exception_only(type(exc), exc)
    )
    return lines


def _is_kernel_frame(filename):
    # The kernel runs from `-c`, so its frames are "<string>"; asyncio's machinery that
    # awaits top-level code is the kernel's too.
    if filename == "<string>":
        return True
    return os.path.join("asyncio", "") in filename and "base_events" in filename


def _execute(req):
    _state.count += 1
    n = _state.count
    rid = req["id"]
    code = req.get("code", "")
    name = _cell_name(n)
    _remember_cell(name, code)
    _stdout.reset()
    _stderr.reset()
    _state.request = rid
    _state.interrupt_pending = False
    _idle.release()
    status = "ok"
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _stdout, _stderr
    try:
        try:
            body, expr = _compile_cell(code, name)
        except Exception as e:
            # Not only SyntaxError: a NUL byte is a ValueError before Python 3.12, deep
            # nesting a RecursionError or MemoryError. Uncaught, the cell never ended.
            _send_error(e)
            status = "error"
        else:
            try:
                _state.running_user_code = True
                if _state.interrupt_pending:
                    raise KeyboardInterrupt
                _run(body)
                value = _run(expr) if expr is not None else None
                if isinstance(value, _CoroutineType):
                    value = _loop().run_until_complete(value)
                _state.running_user_code = False
                _flush_streams()
                _patch_pyplot()
                _show_figures()
                if value is not None:
                    _user["_"] = value
                    data, metadata = _bundle(value)
                    _send_rich("result", data, metadata)
            except KeyboardInterrupt as e:
                _state.running_user_code = False
                _send_error(e, ename="KeyboardInterrupt")
                status = "interrupted"
            except SystemExit as e:
                _state.running_user_code = False
                _send_error(e)
                status = "error"
            except BaseException as e:
                _state.running_user_code = False
                _send_error(e)
                status = "error"
            finally:
                _state.running_user_code = False
            if status != "ok":
                # Figures drawn before the error are still shown.
                try:
                    _patch_pyplot()
                    _show_figures()
                except Exception:
                    pass
    finally:
        _state.running_user_code = False
        _idle.acquire()
        sys.stdout, sys.stderr = old_out, old_err
        _flush_streams()
        _state.request = None
    _emit(
        {
            "type": "done",
            "id": rid,
            "status": status,
            "execution_count": n,
            "dropped": {"stdout": _stdout.dropped, "stderr": _stderr.dropped},
        }
    )


def _send_error(exc, ename=None):
    _flush_streams()
    _emit(
        {
            "type": "error",
            "id": _state.request,
            "ename": ename or type(exc).__name__,
            "evalue": str(exc),
            "traceback": _user_traceback(exc),
        }
    )


# ------------------------------------------------------------------------------------------
# Other requests


def _is_complete(req):
    """Like Python's own prompt: a compound statement is complete only after a blank line,
    so more lines can be added to its block. Several statements at once (pasted) are
    complete when they compile."""
    import codeop

    code = req.get("code", "")
    # Lines as the prompt joins them: without the newline that ends the last one (a blank
    # last line then shows as a trailing newline).
    lines = code[:-1] if code.endswith("\n") else code
    try:
        compiled = codeop.compile_command(lines, "<input>", "single")
    except (SyntaxError, OverflowError, ValueError):
        compiled = False
    if compiled is False:
        # More than one statement, or `await` at the top level (fine for us, not for
        # codeop): complete if it compiles as a whole.
        try:
            compile(code, "<input>", "exec", flags=_ast.PyCF_ONLY_AST | _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
            return {"status": "complete"}
        except SyntaxError:
            try:
                compiled = codeop.compile_command(code, "<input>", "exec")
            except (SyntaxError, OverflowError, ValueError):
                return {"status": "invalid"}
    if compiled is None:
        last = code.rstrip("\n").split("\n")[-1] if code.strip() else ""
        indent = last[: len(last) - len(last.lstrip())]
        if last.rstrip().endswith(":"):
            indent += "    "
        return {"status": "incomplete", "indent": indent}
    return {"status": "complete"}


def _user_names():
    return sorted(
        k
        for k, v in _user.items()
        if not k.startswith("_")
        and k not in _KERNEL_NAMES
        and not isinstance(v, _ModuleType)
    )


def _json_exact(value, depth=0):
    """Whether `value` converts to JSON and back without change."""
    if depth > 100:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_json_exact(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and _json_exact(v, depth + 1) for k, v in value.items()
        )
    # Tuples, sets, objects: JSON would change them (a tuple comes back a list).
    return False


def _describe(value):
    try:
        text = repr(value)
    except Exception as e:
        text = "<repr failed: %s>" % e
    return {"type": type(value).__name__, "repr": text[:1000]}


def _get_vars(req):
    names = req.get("names")
    wanted = _user_names() if names is None else names
    values, unrep, missing = {}, {}, []
    for name in wanted:
        if name not in _user:
            missing.append(name)
            continue
        value = _user[name]
        if _json_exact(value):
            values[name] = value
        else:
            unrep[name] = _describe(value)
    return {"values": values, "unrepresentable": unrep, "missing": missing}


def _valid_name(name):
    import keyword

    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _set_vars(req):
    values = req.get("values") or {}
    bad = [n for n in values if not _valid_name(n)]
    if bad:
        return {"error": "not valid python names: %s" % ", ".join(map(repr, bad))}
    for name, value in values.items():
        _user[name] = value
    return {"set": sorted(values)}


def _clear_vars(req):
    names = req.get("names")
    wanted = _user_names() if names is None else names
    cleared = []
    for name in wanted:
        if name in _user and not name.startswith("__"):
            del _user[name]
            cleared.append(name)
    return {"cleared": cleared}


def _list_vars(_req):
    return {
        "variables": [
            {"name": k, "type": type(_user[k]).__name__, "json": _json_exact(_user[k])}
            for k in _user_names()
        ]
    }


# ------------------------------------------------------------------------------------------
# State capture (snapshots): the user's globals to a file and back, in a fresh kernel.
#
# File: a magic line, then records. A record is an 8-byte big-endian length, a JSON header of
# that length ({"name", "kind": "module", "module"} or {"name", "kind": "pickle", "size"}),
# and for a pickle `size` bytes of cloudpickle data. Each variable is pickled on its own, so
# one that cannot be pickled is skipped and reported without losing the others, and a large
# value is written straight to the file (nothing large goes over the event pipe).

_STATE_MAGIC = b"sandcell-python-state 1\n"
_KERNEL_GLOBALS = globals()


def _state_module():
    """`_sandcell_state`, a real module (not `__main__`) whose `user_globals()` pickles refer
    to by name: functions restored from a state file get the new kernel's globals as theirs,
    instead of a private copy of the globals they used (cloudpickle's default)."""
    mod = sys.modules.get("_sandcell_state")
    if mod is None:
        mod = _ModuleType("_sandcell_state")

        def user_globals():
            return _user

        user_globals.__module__ = "_sandcell_state"
        user_globals.__qualname__ = "user_globals"
        mod.user_globals = user_globals
        sys.modules["_sandcell_state"] = mod
    return mod


class _GlobalsRef:
    """Stands for the user's globals inside a pickle."""

    def __reduce__(self):
        return (_state_module().user_globals, ())


def _state_pickler():
    """A cloudpickle pickler class for the user's values. Functions and classes made in cells
    (`__module__` is `__main__`) are pickled by value, as cloudpickle does for `__main__`; their
    globals are the namespace itself (by reference, see `_GlobalsRef`), not copies of the
    values they use, which are variables restored on their own."""
    import cloudpickle

    class Pickler(cloudpickle.CloudPickler):
        def __init__(self, file):
            super().__init__(file, protocol=cloudpickle.DEFAULT_PROTOCOL)
            self.globals_ref[id(_user)] = _GlobalsRef()

        def reducer_override(self, obj):
            if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)):
                # cloudpickle would copy a file open for reading as its contents.
                raise _NotCarried("an open file: its descriptor does not survive a snapshot")
            if (
                getattr(obj, "__globals__", None) is _KERNEL_GLOBALS
                and obj is not _state_module().user_globals
            ):
                # The kernel's own functions (`display`): by name when the new kernel has
                # them as builtins, never by value (with the kernel's state).
                name = getattr(obj, "__name__", "")
                if getattr(builtins, name, None) is obj:
                    return (getattr, (builtins, name))
                raise _NotCarried("a function of the kernel itself")
            rv = super().reducer_override(obj)
            if isinstance(obj, type) and isinstance(rv, tuple) and len(rv) >= 3:
                # cloudpickle leaves `__module__` out of a subclass's dict when it equals
                # the base's (the same interned string), and the class then comes back in
                # module `types`.
                state = rv[2]
                if (
                    isinstance(state, tuple)
                    and len(state) == 2
                    and isinstance(state[0], dict)
                    and "__module__" not in state[0]
                    and "__module__" in obj.__dict__
                ):
                    clsdict = dict(state[0])
                    clsdict["__module__"] = obj.__dict__["__module__"]
                    rv = rv[:2] + ((clsdict, state[1]),) + rv[3:]
            return rv

        def _dynamic_function_reduce(self, func):
            rv = super()._dynamic_function_reduce(func)
            if func.__globals__ is not _user or len(rv) < 3:
                return rv
            state, slotstate = rv[2]
            slotstate = dict(slotstate)
            slotstate["__globals__"] = {}
            return rv[:2] + ((state, slotstate),) + rv[3:]

    return Pickler


def _state_names():
    """The user's variables worth carrying, in definition order."""
    return [
        k
        for k in list(_user)
        if not (k.startswith("__") and k.endswith("__"))
        and k != "_"
        and k not in _KERNEL_NAMES
    ]


class _NotCarried(Exception):
    """A value that state capture leaves out on purpose; its message is the reason."""


def _short(exc):
    text = str(exc) if isinstance(exc, _NotCarried) else "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 300 else text[:297] + "..."


def _state_path(req):
    path = req.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError("path must be an absolute path")
    return path


def _write_record(f, header, data=None):
    raw = _json_dumps(header).encode("ascii")
    f.write(len(raw).to_bytes(8, "big"))
    f.write(raw)
    if data is not None:
        f.write(data)


# A pickle's header is written before the pickle, its size padded to this many characters
# (JSON allows the blanks) and filled in after: the pickle goes straight into the file, not
# through a buffer copied into it.
_SIZE_WIDTH = 20

# Values a flat list or tuple may hold to be pickled without the memo (see `_flat`).
_FLAT_ATOMS = frozenset((str, bytes, int, float, bool, type(None)))

# Below this many items the memo costs too little to be worth the checks.
_FLAT_MIN = 1024


def _sole_refcount():
    """What `sys.getrefcount` says, through `map`, of an item only its list refers to
    (None where there is no such count: the checks then never pass)."""
    getrefcount = getattr(sys, "getrefcount", None)
    if getrefcount is None:
        return None
    return max(map(getrefcount, [object()]))


def _flat(value):
    """Whether `value` is a long list or tuple of strings, bytes and numbers that nothing
    else refers to, not even the list twice. Its pickle needs no memo: the memo only refers
    back to an object met before, which no item of such a list is (each is met once and
    holds nothing), and the list itself is met once (it is the variable). Without it the
    pickler skips a hash-table entry per string, most of the time of a long list of
    strings (3/4 of it for 96,000 strings of 50 characters); the pickle reads back the
    same."""
    kind = type(value)
    if (kind is not list and kind is not tuple) or len(value) < _FLAT_MIN:
        return False
    if not set(map(type, value)) <= _FLAT_ATOMS:
        return False
    # Referred to elsewhere (or twice here): the memo may refer back to it.
    sole = _sole_refcount()
    return sole is not None and max(map(sys.getrefcount, value)) <= sole


def _dump_value(f, value, Pickler):
    """Pickles `value` into `f` at its position."""
    if _flat(value):
        import pickle
        import cloudpickle

        p = pickle.Pickler(f, protocol=cloudpickle.DEFAULT_PROTOCOL)
        p.fast = True  # no memo (see `_flat`)
        p.dump(value)
    else:
        Pickler(f).dump(value)


def _write_pickle_record(f, name, value, Pickler):
    """Writes `value`'s record at the end of `f`, pickled straight into it, its size left
    blank; returns where the header is and what it must say (written by `_fill_headers`).
    When `value` cannot be pickled, cuts `f` back to where the record began and raises."""
    start = f.tell()
    head = _json_dumps({"name": name, "kind": "pickle"})[:-1] + ', "size": '
    raw = (head + " " * _SIZE_WIDTH + "}").encode("ascii")
    try:
        f.write(len(raw).to_bytes(8, "big") + raw)
        _dump_value(f, value, Pickler)
    except BaseException:
        f.seek(start)
        f.truncate()
        raise
    size = f.tell() - start - 8 - len(raw)
    return start + 8, (head + str(size).ljust(_SIZE_WIDTH) + "}").encode("ascii")


def _fill_headers(f, headers):
    """Writes the headers `_write_pickle_record` left blank, once the records are flushed
    (one seek-free write each, the buffered writer left alone)."""
    f.flush()
    fd = f.fileno()
    for offset, raw in headers:
        if os.pwrite(fd, raw, offset) != len(raw):
            raise OSError("a state file's header was written short")


def _dump_state(req):
    path = _state_path(req)
    try:
        Pickler = _state_pickler()
    except ImportError:
        return {"error": "cloudpickle is not installed in the sandbox (python3-cloudpickle)"}
    saved, skipped, modules, values = [], [], [], []
    for name in _state_names():
        value = _user.get(name)
        if isinstance(value, _ModuleType):
            mod_name = getattr(value, "__name__", None)
            if isinstance(mod_name, str) and sys.modules.get(mod_name) is value:
                modules.append((name, mod_name))
            else:
                skipped.append(
                    {"name": name, "type": "module", "reason": "a module that cannot be imported by name"}
                )
        else:
            values.append(name)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            f.write(_STATE_MAGIC)
            for name, mod_name in modules:
                _write_record(f, {"name": name, "kind": "module", "module": mod_name})
                saved.append(name)
            headers = []
            for name in values:
                value = _user.get(name)
                try:
                    headers.append(_write_pickle_record(f, name, value, Pickler))
                except KeyboardInterrupt:
                    raise
                except BaseException as e:
                    skipped.append({"name": name, "type": type(value).__name__, "reason": _short(e)})
                    continue
                saved.append(name)
            size = f.tell()
            _fill_headers(f, headers)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"saved": saved, "skipped": skipped, "bytes": size}


def _load_state(req):
    import pickle
    import importlib

    path = _state_path(req)
    _state_module()
    restored, failed = [], []
    with open(path, "rb") as f:
        if f.read(len(_STATE_MAGIC)) != _STATE_MAGIC:
            return {"error": "%s is not a python state file" % path}
        while True:
            size = f.read(8)
            if not size:
                break
            if len(size) != 8:
                return {"error": "%s is truncated" % path}
            header = _json_loads(f.read(int.from_bytes(size, "big")))
            name, kind = header.get("name"), header.get("kind")
            if kind == "pickle":
                data = f.read(header["size"])
                if len(data) != header["size"]:
                    return {"error": "%s is truncated" % path}
                try:
                    _user[name] = pickle.loads(data)
                except KeyboardInterrupt:
                    raise
                except BaseException as e:
                    failed.append({"name": name, "reason": _short(e)})
                    continue
                del data
            elif kind == "module":
                try:
                    _user[name] = importlib.import_module(header["module"])
                except KeyboardInterrupt:
                    raise
                except BaseException as e:
                    failed.append({"name": name, "reason": _short(e)})
                    continue
            else:
                if isinstance(header.get("size"), int):
                    f.seek(header["size"], 1)
                failed.append({"name": name, "reason": "unknown record kind %r" % kind})
                continue
            restored.append(name)
    return {"restored": restored, "failed": failed}


_CALLS = {
    "is_complete": _is_complete,
    "get_vars": _get_vars,
    "set_vars": _set_vars,
    "clear_vars": _clear_vars,
    "list_vars": _list_vars,
    "dump_state": _dump_state,
    "load_state": _load_state,
}


def _serve():
    _emit(
        {
            "type": "ready",
            "language": "python",
            "version": "%d.%d.%d" % sys.version_info[:3],
            "pid": os.getpid(),
        }
    )
    while True:
        try:
            with _ctl_lock:
                line = _ctl.readline()
        except KeyboardInterrupt:
            continue  # idle SIGINT
        if not line:
            return
        try:
            req = _json_loads(line)
        except ValueError as e:
            _emit({"type": "reply", "id": None, "error": "bad request: %s" % e})
            continue
        op = req.get("op")
        if op == "host_reply":
            # An answer the agent sent as a cell ended: for a thread of that cell still
            # waiting, else for nobody (its call was interrupted). No reply either way.
            _hc_between_cells(req)
            continue
        try:
            if op == "execute":
                _execute(req)
                continue
            handler = _CALLS.get(op)
            reply = handler(req) if handler else {"error": "unknown op %r" % op}
        except KeyboardInterrupt:
            reply = {"error": "interrupted"}
        except Exception as e:
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        reply.update({"type": "reply", "id": req.get("id")})
        _emit(reply)


_serve()
