"""python/pyproject.toml: an offline install, and the vLLM plugin it registers.

vLLM cannot be installed here, so the plugin is checked against a stand-in
``vllm`` package written into a temporary directory: only
``vllm.distributed.kv_transfer.kv_connector.factory.KVConnectorFactory``,
modelled on vLLM's own (``register_connector(name, module_path,
class_name)``, a ``ValueError`` for a name already registered, a lazy
import of the module when a connector class is asked for by name, and
``kv_connector_module_path`` consulted only for names it does not hold).

Every build runs on a copy of python/: pip builds in place, and setuptools
writes build/ and kvtier.egg-info/ next to pyproject.toml.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PIP_OFFLINE = ["--no-build-isolation", "--no-index", "--disable-pip-version-check", "--no-input",
               "--no-cache-dir"]
ENTRY_GROUP = "vllm.general_plugins"

FAKE_FACTORY = '''\
"""Stand-in for vLLM's KVConnectorFactory (vLLM cannot be installed here)."""
import importlib


class KVConnectorFactory:
    _registry = {}
    # Not in vLLM: what each name was registered with, for the test to read.
    registered = {}

    @classmethod
    def register_connector(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader
        cls.registered[name] = (module_path, class_name)

    @classmethod
    def get_connector_class(cls, kv_transfer_config):
        name = kv_transfer_config.kv_connector
        if name in cls._registry:
            return cls._registry[name]()
        if kv_transfer_config.kv_connector_module_path is None:
            raise ValueError(f"Unsupported connector type: {name}")
        module = importlib.import_module(kv_transfer_config.kv_connector_module_path)
        return getattr(module, name)


# vLLM registers its own connectors when the module is imported.
KVConnectorFactory.register_connector(
    "SharedStorageConnector",
    "vllm.distributed.kv_transfer.kv_connector.v1.shared_storage_connector",
    "SharedStorageConnector")
'''


def _source_copy(dest: str) -> str:
    """Copies what the build reads (pyproject.toml and kvtier/) to dest."""
    os.makedirs(dest)
    shutil.copy2(os.path.join(PYTHON_DIR, "pyproject.toml"), dest)
    shutil.copytree(os.path.join(PYTHON_DIR, "kvtier"), os.path.join(dest, "kvtier"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _pip(python: str, *args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run([python, "-m", "pip", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _run(code: str, path: list, cwd: str) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter with only path ahead of site-packages."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """kvtier installed with pip --target from a copy of python/; the target dir."""
    root = tmp_path_factory.mktemp("pkg")
    before = sorted(os.listdir(PYTHON_DIR))
    src = _source_copy(str(root / "src"))
    target = str(root / "site")
    r = _pip(sys.executable, "install", *PIP_OFFLINE, "--no-deps", "--target", target, src,
             cwd=str(root))
    assert r.returncode == 0, f"pip install failed:\n{r.stdout}\n{r.stderr}"
    assert sorted(os.listdir(PYTHON_DIR)) == before, "the build wrote into python/"
    return target


def _fake_vllm(root) -> str:
    """Writes the stand-in vllm package under root; the directory to put on the path."""
    base = root / "fake_vllm"
    pkg = base / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    pkg.mkdir(parents=True)
    for d in (base / "vllm", base / "vllm" / "distributed",
              base / "vllm" / "distributed" / "kv_transfer", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "factory.py").write_text(FAKE_FACTORY)
    return str(base)


def test_pip_install_offline_installs_every_subpackage(installed):
    for rel in ("kvtier/__init__.py", "kvtier/vllm.py", "kvtier/vllm_plugin.py",
                "kvtier/sglang.py", "kvtier/harness/engine.py",
                "kvtier/harness/sglang_flow.py", "kvtier/testing/daemon.py"):
        assert os.path.isfile(os.path.join(installed, rel)), rel
    assert not os.path.exists(os.path.join(installed, "tests"))


def test_declared_dependencies_resolve_offline(tmp_path):
    """With dependency checks on and no index, pip must find torch and numpy
    already installed (a venv that sees the system's site-packages): nothing
    is downloaded, and the declared versions admit Debian's torch 1.13.0a0."""
    venv = str(tmp_path / "venv")
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        venv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    python = os.path.join(venv, "bin", "python")
    src = _source_copy(str(tmp_path / "src"))
    r = _pip(python, "install", *PIP_OFFLINE, src, cwd=str(tmp_path))
    assert r.returncode == 0, f"pip install failed:\n{r.stdout}\n{r.stderr}"
    r = _pip(python, "check", cwd=str(tmp_path))
    assert r.returncode == 0, f"pip check:\n{r.stdout}\n{r.stderr}"


def test_distribution_exposes_the_vllm_entry_point(installed, tmp_path):
    r = _run(f"""
        import importlib.metadata as md, json
        dists = [d for d in md.distributions(path=[{installed!r}]) if d.metadata["Name"] == "kvtier"]
        assert len(dists) == 1, dists
        eps = [(e.name, e.value) for e in dists[0].entry_points if e.group == {ENTRY_GROUP!r}]
        # What vLLM's loader sees: the group over the whole path.
        fn = [e for e in md.entry_points(group={ENTRY_GROUP!r}) if e.name == "kvtier"][0].load()
        print(json.dumps({{"eps": eps, "module": fn.__module__, "file": fn.__globals__["__file__"],
                           "requires": dists[0].requires}}))
    """, [installed], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["eps"] == [["kvtier", "kvtier.vllm_plugin:register"]]
    assert out["module"] == "kvtier.vllm_plugin"
    assert out["file"].startswith(installed)
    assert sorted(req.split()[0].split(">")[0] for req in out["requires"]) == ["numpy", "torch"]


def test_plugin_registers_the_connector_with_vllm_factory(installed, tmp_path):
    """The entry point, called twice the way vLLM's plugin loader calls it,
    registers KVTierConnector -> kvtier.vllm.KVTierConnector once; the factory
    then resolves the name without kv_connector_module_path."""
    fake = _fake_vllm(tmp_path)
    r = _run(f"""
        import importlib.metadata as md, json, sys
        from types import SimpleNamespace
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as F

        for _ in range(2):  # vLLM may run general plugins more than once
            for ep in md.entry_points(group={ENTRY_GROUP!r}):
                if ep.name == "kvtier":
                    assert ep.load()() is True
        import kvtier.vllm_plugin
        assert kvtier.vllm_plugin.register() is True
        lazy = "kvtier.vllm" not in sys.modules

        cfg = SimpleNamespace(kv_connector="KVTierConnector", kv_connector_module_path=None)
        cls = F.get_connector_class(cfg)
        from kvtier._vllm_compat import KVConnectorBase_V1
        print(json.dumps({{
            "registered": F.registered, "lazy": lazy,
            "cls": [cls.__module__, cls.__qualname__],
            "subclass": issubclass(cls, KVConnectorBase_V1),
            "file": sys.modules["kvtier.vllm"].__file__,
        }}))
    """, [fake, installed], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["registered"]["KVTierConnector"] == ["kvtier.vllm", "KVTierConnector"]
    assert len(out["registered"]) == 2  # vLLM's own stays, nothing else added
    assert out["lazy"], "registering imported kvtier.vllm (the factory imports it lazily)"
    assert out["cls"] == ["kvtier.vllm", "KVTierConnector"]
    assert out["subclass"]
    assert out["file"].startswith(installed)


def test_plugin_is_silent_without_vllm_and_never_raises(installed, tmp_path):
    # No vllm at all: a quiet no-op.
    r = _run("""
        import logging, kvtier.vllm_plugin as p
        logging.basicConfig(level=logging.DEBUG)
        assert p.register() is False
    """, [installed], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "kvtier" not in r.stderr and r.stdout == ""

    # A vllm whose factory cannot be imported: a warning, no exception.
    broken = tmp_path / "broken" / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    broken.mkdir(parents=True)
    for d in (broken, broken.parent, broken.parent.parent, broken.parent.parent.parent):
        (d / "__init__.py").write_text("")
    (broken / "factory.py").write_text("raise RuntimeError('factory broke')\n")
    r = _run("""
        import kvtier.vllm_plugin as p
        assert p.register() is False
    """, [str(tmp_path / "broken"), installed], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "kv_connector_module_path" in r.stderr and "factory broke" in r.stderr
