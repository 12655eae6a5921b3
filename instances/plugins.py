"""Plug-ins from outside the package: a user's own policies, objective terms, solver
backends, performance-model kinds or truth oracles, registered with the decorators the
built-in ones use (``@register_policy``, ``@register_term``, ...), without editing this
package.

A plug-in is a Python module that registers what it defines when it is imported. It is
named by a file path (``my_terms.py``) or by a module name importable from ``sys.path``
(``mylab.arena_terms``): on the command line (``arena ... --plugin SPEC``, anywhere in the
command, repeatable), in the environment (``ARENA_PLUGINS``, ``os.pathsep``-separated), or
as an installed package's entry point in the group ``arena_sched.plugins`` (loaded by every
``arena`` command unless ``ARENA_DISABLE_PLUGIN_AUTOLOAD`` is set).

The registries a caller passes are discovered (their built-in modules imported) *before*
a plug-in runs, so a plug-in that reuses a built-in name is refused at its own
registration, naming the plug-in, instead of breaking a later lookup. A plug-in that
fails to import, calls ``sys.exit`` while importing, or registers nothing, is an
``InputError`` naming it; nothing is loaded
silently or half-way (a file plug-in that fails leaves no module behind).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import stat
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .errors import InputError
from .registry import Registry

ENTRY_POINT_GROUP = "arena_sched.plugins"
ENV_PLUGINS = "ARENA_PLUGINS"
ENV_DISABLE_AUTOLOAD = "ARENA_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class LoadedPlugin:
    """A plug-in that loaded: how it was named, where from, what it registered."""
    spec: str                         # as given (a path, a module name, or an entry point's value)
    source: str                       # "--plugin", "ARENA_PLUGINS" or "entry point NAME (DIST)"
    module: str                       # the module's name in sys.modules
    path: str | None                  # its file, when it has one
    sha256: str | None                # of that file: a result records exactly which code decided
    registered: tuple[str, ...]       # "policy energy-aware", "objective term energy", ...

    def describe(self) -> str:
        where = self.path or self.module
        digest = f" sha256:{self.sha256[:12]}" if self.sha256 else ""
        return f"{where}{digest} ({', '.join(self.registered)})"


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or (os.altsep is not None and os.altsep in spec)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _where(exc: BaseException, path: str | None) -> str:
    """' (FILE, line N)' of the frame that raised, preferring the plug-in's own file."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path is not None and os.path.abspath(f.filename) == path]
    chosen = own or list(frames)
    return f" ({chosen[-1].filename}, line {chosen[-1].lineno})" if chosen else ""


def _snapshot(registries: Iterable[Registry]) -> dict[str, set[str]]:
    return {r.kind: set(r.names()) for r in registries}


def _import(spec: str, source: str, field: str) -> tuple[str, str | None, bool]:
    """Import a plug-in; (module name, file path or None, whether this call imported it)."""
    if _is_path(spec):
        path = Path(spec).expanduser()
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            what = "is a symbolic link to a missing file" if path.is_symlink() else "does not exist"
            raise InputError(f"plugin {spec} ({source}) {what}", field=field) from None
        except OSError as e:            # a link loop, a name too long, no permission
            raise InputError(f"plugin {spec} ({source}) cannot be read: {e.strerror or e}", field=field) from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"plugin {spec} ({source}) is a folder, not a Python file", field=field)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"plugin {spec} ({source}) is not a regular file (a pipe, a device or a socket)",
                             field=field)
        path = path.resolve()
        name = f"arena_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
        if name in sys.modules:
            return name, str(path), False
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise InputError(f"plugin {spec} ({source}) cannot be loaded as a Python module", field=field)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module          # dataclasses and pickling look the module up by name
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return name, str(path), True
    fresh = spec not in sys.modules
    module = importlib.import_module(spec)
    file = getattr(module, "__file__", None)
    return spec, (os.path.abspath(file) if file else None), fresh


def _load_error(e: Exception, spec: str, source: str, field: str, path_hint: str | None) -> InputError:
    """``e``, raised while importing a plug-in, as an ``InputError`` naming the plug-in."""
    if isinstance(e, InputError):
        return e
    if isinstance(e, ModuleNotFoundError) and not _is_path(spec) and e.name is not None \
            and spec.startswith(e.name):
        return InputError(f"plugin {spec} ({source}): no module named {e.name!r} on the Python path "
                          "(give a file path ending in .py, or install the module)", field=field)
    where = "" if isinstance(e, SyntaxError) else _where(e, path_hint)    # a SyntaxError names its line
    return InputError(f"plugin {spec} ({source}) failed to load: {type(e).__name__}: {e}{where}", field=field)


PLUGIN_MARK = "__arena_plugin__"     # set on a module once it has loaded as a plug-in


def plugin_files() -> dict[str, str]:
    """{absolute file: module name} of the plug-ins loaded in this process."""
    out = {}
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if file and getattr(mod, PLUGIN_MARK, False):
            out[os.path.abspath(file)] = name
    return out


def defined_in(obj: object) -> str | None:
    """The plug-in file that defines ``obj``'s class (or ``obj``, a class or a function);
    None when it is not a plug-in's."""
    target = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__code__") else type(obj)
    mod = sys.modules.get(getattr(target, "__module__", "") or "")
    file = getattr(mod, "__file__", None)
    return os.path.abspath(file) if file and getattr(mod, PLUGIN_MARK, False) else None


def failure_site(exc: BaseException) -> tuple[str, int] | None:
    """(file, line) where ``exc`` was raised: the innermost frame in a plug-in's file when
    there is one (the plug-in's own code, not the project's it called), else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    files = plugin_files()
    own = [f for f in frames if os.path.abspath(f.filename) in files]
    f = (own or frames)[-1]
    return f.filename, f.lineno or 0


def load_plugin(spec: str, source: str = "--plugin", *, registries: Iterable[Registry] = (),
                field: str = "--plugin") -> LoadedPlugin:
    """Import one plug-in after discovering ``registries``; an ``InputError`` naming it if
    it cannot be imported, fails while importing, or registers nothing in them. A module
    this process imported before is not run again (its record lists nothing registered)."""
    registries = tuple(registries)
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty plugin name ({source})", field=field)
    spec = spec.strip()
    before = _snapshot(registries)
    path_hint = os.path.realpath(os.path.expanduser(spec)) if _is_path(spec) else None   # (a loop: no error)
    try:
        module, path, fresh = _import(spec, source, field)
    except (Exception, SystemExit) as e:    # (KeyboardInterrupt stays what it is)
        for r in registries:            # what it registered before failing goes back out
            for name in set(r.names()) - before[r.kind]:
                r.unregister(name)
        if isinstance(e, SystemExit):   # exit 0 having done nothing would look like success
            raise InputError(f"plugin {spec} ({source}) called sys.exit({e.code!r}) while loading"
                             f"{_where(e, path_hint)}", field=field) from None
        raise _load_error(e, spec, source, field, path_hint) from None
    after = _snapshot(registries)
    added = tuple(f"{kind} {name}" for kind in after for name in sorted(after[kind] - before[kind]))
    for r in registries:                # an error of what it registered names it (Registry.origin)
        for name in after[r.kind] - before[r.kind]:
            r.set_origin(name, path or module)
    mod = sys.modules.get(module)
    if not fresh and registries and not added and not getattr(mod, PLUGIN_MARK, False):
        raise InputError(f"plugin {spec} ({source}) registered nothing: it is a module imported before that "
                         "defines no policy, objective term, solver backend or performance-model kind",
                         field=field)
    if fresh and registries and not added:
        sys.modules.pop(module, None)
        raise InputError(f"plugin {spec} ({source}) registered nothing; a plug-in registers what it defines "
                         "when imported (@register_policy, @register_term, @register_backend, @register_kind)",
                         field=field)
    if mod is not None:
        setattr(mod, PLUGIN_MARK, True)          # loaded as a plug-in: naming it again is no error
    digest = _sha256(Path(path)) if path is not None and Path(path).is_file() else None
    return LoadedPlugin(spec=spec, source=source, module=module, path=path, sha256=digest, registered=added)


def requested_specs(flags: Iterable[str] = (), env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(spec, source) for the command line's plug-ins, then the environment's."""
    env = os.environ if env is None else env
    specs = [(s, "--plugin") for s in flags]
    specs += [(s, ENV_PLUGINS) for s in env.get(ENV_PLUGINS, "").split(os.pathsep) if s.strip()]
    return specs


def entry_point_specs(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(module, source) of the installed entry points in ``arena_sched.plugins``, unless
    ``ARENA_DISABLE_PLUGIN_AUTOLOAD`` is set to anything but empty or 0."""
    env = os.environ if env is None else env
    if env.get(ENV_DISABLE_AUTOLOAD, "").strip() not in ("", "0"):
        return []
    out = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep.dist, "name", None) or "?"
        out.append((ep.value.split(":", 1)[0].strip(), f"entry point {ep.name} ({dist})"))
    return out


def load_plugins(specs: Iterable[tuple[str, str]], registries: Iterable[Registry]) -> list[LoadedPlugin]:
    """Load each (spec, source) in order after discovering ``registries``; a module named
    twice (by the command line and the environment) is loaded and listed once."""
    registries = tuple(registries)
    out: list[LoadedPlugin] = []
    for spec, source in specs:
        p = load_plugin(spec, source, registries=registries)
        if all(q.module != p.module for q in out):
            out.append(p)
    return out
