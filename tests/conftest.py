"""Shared pytest fixtures. Add yours below; keep heavy setup in helper modules."""
# The GCS emulator (fake-gcs-server): `gcs_emulator` (session) and `gcs` (per test).
# Importing gcs_emulator also sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before any
# test module can import gcsfs.
from gcs_emulator import gcs, gcs_emulator  # noqa: F401

import pytest  # noqa: E402

from tb_bottleneck_plugin import discovery  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_sniff_cache():
    """Discovery caches Kineto sniffs by (URL, fingerprint) per process: start each test clean."""
    discovery.clear_sniff_cache()
    yield
    discovery.clear_sniff_cache()
