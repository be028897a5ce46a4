"""TensorBoard's entry point for the gpuprof plugin (``tensorboard_plugins`` in setup.py).

TensorBoard imports this module at start for every installed plugin, so it holds only the
loader: the plugin and its dependencies are imported in :meth:`GpuProfPluginLoader.load`.
If anything there fails (a broken install, a missing optional dependency), TensorBoard logs
one warning and carries on without the tab.
"""

from __future__ import annotations

import logging

from tensorboard.plugins import base_plugin

logger = logging.getLogger("tb_gpuprof")


class GpuProfPluginLoader(base_plugin.TBLoader):
    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin | None:
        try:
            from .plugin import GpuProfPlugin

            return GpuProfPlugin(context)
        except Exception as e:
            logger.warning("tb_gpuprof: GPU Prof tab disabled, the plugin failed to load: %s: %s",
                           type(e).__name__, e)
            return None
