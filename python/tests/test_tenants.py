"""A tenant's token from Python against a real daemon with tenants.

The daemon asks every connection for a token; a tenant's gets no arena, so
the client stages slots in its own memory and the connectors work as they do
with the arena. A wrong or missing token and another tenant's namespace are
refused with UNAUTHORIZED, and the token appears in no log.
"""

import json
import logging
import os

import pytest
import torch

from kvtier import auth, vllm
from kvtier.client import Client, Unauthorized
from kvtier.testing import Daemon
from conftest import CHUNK
from harness_util import assert_close, engine, prompt, reference

ALPHA = "alpha-token-0123456789"
BETA = "beta-token-0123456789"


@pytest.fixture(scope="module")
def tenant_daemon(kvtier_bin, tmp_path_factory):
    tenants = [{"name": "alpha", "token": ALPHA, "namespaces": ["alpha"]},
               {"name": "beta", "token": BETA, "namespaces": ["beta/*"]}]
    d = Daemon(kvtier_bin, str(tmp_path_factory.mktemp("tenants")), chunk_size=CHUNK, extra_env={
        "KVTIER_ADMIN_TOKEN": "admin-token-0123456789",
        "KVTIER_TCP_TOKEN": "tcp-token-0123456789",
        "KVTIER_TENANTS": json.dumps(tenants),
    }).start()
    yield d
    d.stop()


def _chunk(seed, nbytes=512):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def test_right_token_stores_and_reads_without_the_arena(tenant_daemon):
    tokens = list(range(100, 100 + 3 * CHUNK))
    chunks = [_chunk(i) for i in range(3)]
    with Client(tenant_daemon.socket_path, token=ALPHA) as c:
        assert c.staged and not c.hello.has_arena
        s = c.scope("m", "uint8/KV_2LTD", namespace="alpha")
        assert c.store(c.tokens(s, tokens), chunks) == 3
    with Client(tenant_daemon.socket_path, token=ALPHA) as c:
        s = c.scope("m", "uint8/KV_2LTD", namespace="alpha")
        assert c.lookup(c.tokens(s, tokens)).chunks == 3
        got = c.prepare_retrieve(c.tokens(s, tokens, skip=CHUNK))
        assert got.tokens == 2 * CHUNK and len(got.slots) == 2
        for slot, want in zip(got.slots, chunks[1:]):
            assert torch.equal(c.slot_tensor(slot), want)
        c.release(got.lease)
        # A store's slots are filled in place, then committed, as with the arena.
        more = list(range(900, 900 + 2 * CHUNK))
        slots = c.prepare_store(c.tokens(s, more), [512, 512])
        for slot, seed in zip(slots.slots, (7, 8)):
            c.slot_tensor(slot).copy_(_chunk(seed))
        assert c.commit_store(slots.lease, 2) == 2
        got = c.prepare_retrieve(c.tokens(s, more))
        assert [torch.equal(c.slot_tensor(x), _chunk(k)) for x, k in zip(got.slots, (7, 8))] == [True, True]
        c.release(got.lease)


@pytest.mark.parametrize("token", ["", "wrong-token-0123456789", "admin-token-0123456789"])
def test_wrong_or_missing_token_is_refused(tenant_daemon, token):
    with pytest.raises(Unauthorized) as e:
        Client(tenant_daemon.socket_path, token=token)
    assert "wrong or missing token" in str(e.value)
    assert token == "" or token not in str(e.value)


def test_another_tenants_namespace_is_refused(tenant_daemon):
    with Client(tenant_daemon.socket_path, token=ALPHA) as c:
        with pytest.raises(Unauthorized) as e:
            c.scope("m", "uint8/KV_2LTD", namespace="beta/x")
        assert "not one of tenant alpha's" in str(e.value)
        assert c.scope("m", "uint8/KV_2LTD", namespace="alpha") != 0  # the connection stays usable


def test_vllm_connector_with_a_tenant_token(tenant_daemon, tmp_path, caplog, monkeypatch):
    """The connector's token from token_file, from KVTIER_TOKEN, and refused."""
    p = prompt(41, 3 * CHUNK + 5)
    ref = reference(p)
    token_file = tmp_path / "alpha.token"
    token_file.write_text(ALPHA + "\n")
    sock = tenant_daemon.socket_path
    caplog.set_level(logging.DEBUG)
    first = engine(sock, "tenant-model", namespace="alpha", token_file=str(token_file))
    assert_close(first.prefill(p), ref)
    monkeypatch.setenv("KVTIER_TOKEN", ALPHA)
    second = engine(sock, "tenant-model", namespace="alpha")
    assert_close(second.prefill(p), ref)
    assert [s.external_tokens for s in second.steps] == [3 * CHUNK]
    # Beta's token cannot reach alpha's namespace: nothing loads, nothing breaks.
    monkeypatch.setenv("KVTIER_TOKEN", BETA)
    refused = engine(sock, "tenant-model", namespace="alpha")
    assert_close(refused.prefill(p), ref)
    assert [s.external_tokens for s in refused.steps] == [0]
    assert "not one of tenant beta's" in caplog.text
    for secret in (ALPHA, BETA):
        assert secret not in caplog.text
        assert secret not in repr(vllm.Settings.from_extra({"token": secret}))
    assert secret not in tenant_daemon.log()


def test_vllm_connector_layerwise_with_a_tenant_token(tenant_daemon):
    """Layerwise mode on a tenant's connection, which has no arena: the
    chunks are read whole and the layers are all ready at once, so the hit
    loads (no load errors) and the logits equal a full prefill."""
    p = prompt(43, 3 * CHUNK + 7)
    ref = reference(p)
    sock = tenant_daemon.socket_path
    first = engine(sock, "tenant-layerwise", namespace="alpha", token=ALPHA, layerwise=True)
    assert_close(first.prefill(p), ref)
    second = engine(sock, "tenant-layerwise", namespace="alpha", token=ALPHA, layerwise=True)
    assert_close(second.prefill(p), ref)
    assert [s.external_tokens for s in second.steps] == [3 * CHUNK]
    assert second.worker_connector.stats.load_errors == 0


def test_token_sources(tmp_path):
    f = tmp_path / "t"
    f.write_text("from-file-0123456789 \n")
    assert auth.resolve_token("inline", str(f), {"KVTIER_TOKEN": "env"}) == "inline"
    assert auth.resolve_token("", str(f), {"KVTIER_TOKEN": "env"}) == "from-file-0123456789"
    assert auth.resolve_token("", "", {"KVTIER_TOKEN": "env", "KVTIER_TOKEN_FILE": str(f)}) == "env"
    assert auth.resolve_token("", "", {"KVTIER_TOKEN_FILE": str(f)}) == "from-file-0123456789"
    assert auth.resolve_token("", "", {}) == ""
    with pytest.raises(ValueError, match="missing"):
        auth.resolve_token("", str(tmp_path / "missing"), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        auth.resolve_token("", str(tmp_path / "empty"), {})


def test_sglang_backend_with_a_tenant_token(tenant_daemon):
    """SGLang's backend stores and reads pages with the tenant's token, staged."""
    from sglang_util import backend
    b = backend(tenant_daemon.socket_path, "sglang-tenant", namespace="alpha", token=ALPHA)
    pages = [torch.arange(12, dtype=torch.float32) + 100 * i for i in range(2)]
    keys = [("%02x" % (i + 1)) * 32 for i in range(2)]  # page keys are the digests' first 16 bytes
    assert b.batch_set(keys, pages)
    assert b.batch_exists(keys) == 2
    got = b.batch_get(keys)
    assert all(g is not None and torch.equal(g.view(torch.float32), want) for g, want in zip(got, pages))
    b.close()
    refused = backend(tenant_daemon.socket_path, "sglang-tenant", namespace="beta/x", token=ALPHA)
    assert refused.batch_exists(keys) == 0 and not refused.batch_set(keys, pages)
    refused.close()
