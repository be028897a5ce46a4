"""The plugin's entry point: found by TensorBoard, light to import, harmless when broken."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from importlib import metadata

import pytest
from tensorboard import program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_ingester
from tensorboard.plugins.core import core_plugin
from werkzeug.test import Client

from tb_gpuprof.plugin import routes
from tb_gpuprof.plugin.fallback import FALLBACK_MODULE
from tb_gpuprof.plugin.loader import GpuProfPluginLoader
from tb_gpuprof.store.writer import EventWriter


def make_app(logdir, plugins=None):
    plugins = plugins or [core_plugin.CorePluginLoader, GpuProfPluginLoader]
    tb = program.TensorBoard(plugins=plugins)
    tb.configure(argv=["tensorboard", "--logdir", str(logdir), "--load_fast=false",
                       "--reload_interval=0", "--reload_task=blocking"])
    ingester = data_ingester.LocalDataIngester(tb.flags)
    ingester.start()
    return Client(application.TensorBoardWSGIApp(tb.flags, plugins, ingester.data_provider,
                                                 None, ingester.deprecated_multiplexer))


def listing(client):
    return json.loads(client.get("/data/plugins_listing").get_data())


def test_entry_point_names_the_loader():
    (ep,) = [e for e in metadata.entry_points(group="tensorboard_plugins") if e.name == "gpuprof"]
    assert ep.load() is GpuProfPluginLoader


def test_loader_module_imports_nothing_heavy():
    code = ("import sys, tb_gpuprof.plugin.loader\n"
            "heavy = ['tb_gpuprof.plugin.plugin', 'tb_gpuprof.store', 'tensorflow', 'torch']\n"
            "print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""


def test_a_plugin_that_fails_to_import_leaves_tensorboard_working(tmp_path, monkeypatch,
                                                                  caplog):
    with EventWriter(tmp_path / "run") as w:
        w.add_scalar("gpuprof/iteration_time_ms", 1.0, 0)
    # The plugin module fails to import (as with a broken install or missing dependency).
    monkeypatch.setitem(sys.modules, "tb_gpuprof.plugin.plugin", None)
    with caplog.at_level(logging.WARNING, logger="tb_gpuprof"):
        client = make_app(tmp_path)
    warnings = [r for r in caplog.records if r.name == "tb_gpuprof"]
    assert len(warnings) == 1 and "GPU Prof tab disabled" in warnings[0].getMessage()
    assert "gpuprof" not in listing(client)
    assert json.loads(client.get("/data/runs").get_data()) == ["run"]


def test_scalars_only_logdir_activates_the_tab(tmp_path):
    with EventWriter(tmp_path / "gp") as w:
        w.add_scalar("gpuprof/iteration_time_ms", 1.0, 0)
    assert listing(make_app(tmp_path))["gpuprof"]["enabled"] is True


def test_logdir_without_gpuprof_data_leaves_the_tab_inactive(tmp_path):
    with EventWriter(tmp_path / "other") as w:
        w.add_scalar("loss", 1.0, 0)
    assert listing(make_app(tmp_path))["gpuprof"]["enabled"] is False


def test_fallback_module_until_the_dashboard_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(routes, "STATIC_DIR", str(tmp_path / "no_static"))
    response = make_app(tmp_path).get("/data/plugin/gpuprof/index.js")
    assert response.status_code == 200
    assert response.get_data(as_text=True) == FALLBACK_MODULE
    # Kernel names hold '<' and '>': the page only ever sets textContent.
    assert "innerHTML" not in FALLBACK_MODULE.replace("Never innerHTML", "")
    assert "export async function render()" in FALLBACK_MODULE


def test_fallback_module_is_valid_javascript(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (needed only to syntax-check the JS)")
    path = tmp_path / "index.mjs"
    path.write_text(FALLBACK_MODULE)
    proc = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
