"""The gpuprof TensorBoard plugin: the TBPlugin face of plugin/data.py, served by routes.py.

Imports run one way: plugin.py -> routes.py -> data.py (routes never import this module).
"""

from __future__ import annotations

import time
from typing import Any

from tensorboard import context as tb_context
from tensorboard.plugins import base_plugin

from ..store import layout
from .data import PluginData
from .routes import make_apps

ACTIVE_CACHE_SECS = 10.0


class GpuProfPlugin(PluginData, base_plugin.TBPlugin):
    plugin_name = layout.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        PluginData.__init__(self, context)
        self._active: tuple[float, bool] = (0.0, False)

    def get_plugin_apps(self) -> dict[str, Any]:
        return make_apps(self)

    def data_plugin_names(self) -> tuple[str, ...]:
        return (layout.PLUGIN_NAME,)

    def is_active(self) -> bool:
        """Only asked when no run has gpuprof blobs: a run with gpuprof scalars only."""
        checked_at, active = self._active
        if time.monotonic() - checked_at < ACTIVE_CACHE_SECS:
            return active
        try:
            active = bool(self.scalar_tags(tb_context.RequestContext(), ""))
        except Exception:
            active = False
        self._active = (time.monotonic(), active)
        return active

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="GPU Prof")
