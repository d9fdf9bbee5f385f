"""One parse of botocore's service models per process, one client class per service, one check of each event
handler (the tests and the demo).

Each `boto3.Session` builds its own botocore loader, which reads and parses every service model its clients need
(EC2's alone is 4.5 MB of JSON): a fresh session's eight clients cost 0.3 to 0.6 s of CPU, a loaded session's about
0.14 s (docs/benchmarks.md, "The suite"). A Lambda container builds its runtime once, so this is paid once there; the
tests build a runtime per test. Installed, every session of the process shares one loader per data path, and with it
the parsed models. Of what is left, a third is botocore registering its ~130 built-in handlers on each new session and
client: it inspects each handler's signature for `**kwargs` and rewrites each event name through its aliases, every
time; and it builds each client's class again, a method per operation (EC2 has 700). Installed, each answer is kept
for the process: a function's signature by its code, an event name's alias by the name (botocore's default aliases
only), a service's client class by its name and API version (each client keeps its own model, events and endpoint).

    boto_models.install()
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import botocore.hooks
import botocore.session
from botocore.client import ClientCreator
from botocore.hooks import EventAliaser
from botocore.loaders import Loader, create_loader

_original = create_loader
_original_accepts_kwargs = botocore.hooks.accepts_kwargs
_original_aliaser_init = EventAliaser.__init__
_original_client_class = ClientCreator._create_client_class
_varkw: dict[object, Any] = {}  # a function's code: its **kwargs parameter's name, or None
_alias_names: dict[str, str] = {}  # an event name: the name botocore's default aliases make of it
_client_classes: dict[tuple[str, str], type] = {}  # a service and its API version: its client class


class _SearchPaths(list[str]):
    """A loader's search paths, to which each new `boto3.Session` appends its own data folder: once is enough."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


@functools.cache
def _shared(search_path_string: str | None = None) -> Loader:
    loader = _original(search_path_string)
    loader._search_paths = _SearchPaths(loader.search_paths)  # the list boto3 appends to
    return loader


def _accepts_kwargs(func: Callable[..., Any]) -> Any:
    """botocore's check of a handler, once per function (a bound method's is its function's); other callables each
    time."""
    code = getattr(getattr(func, "__func__", func), "__code__", None)
    if code is None:
        return _original_accepts_kwargs(func)
    if code not in _varkw:
        _varkw[code] = _original_accepts_kwargs(func)
    return _varkw[code]


def _aliaser_init(self: EventAliaser, event_emitter: Any, event_aliases: dict[str, str] | None = None) -> None:
    _original_aliaser_init(self, event_emitter, event_aliases)
    if event_aliases is None:
        self._alias_name_cache = _alias_names


def _client_class(self: ClientCreator, service_name: str, service_model: Any) -> type:
    key = (service_name, service_model.api_version)
    if key not in _client_classes:
        _client_classes[key] = _original_client_class(self, service_name, service_model)
    return _client_classes[key]


def install() -> None:
    botocore.session.create_loader = _shared  # type: ignore[attr-defined]
    botocore.hooks.accepts_kwargs = _accepts_kwargs
    EventAliaser.__init__ = _aliaser_init  # type: ignore[method-assign]
    ClientCreator._create_client_class = _client_class  # type: ignore[method-assign]


def uninstall() -> None:
    botocore.session.create_loader = _original  # type: ignore[attr-defined]
    botocore.hooks.accepts_kwargs = _original_accepts_kwargs
    EventAliaser.__init__ = _original_aliaser_init  # type: ignore[method-assign]
    ClientCreator._create_client_class = _original_client_class  # type: ignore[method-assign]
