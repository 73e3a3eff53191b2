"""The verified local model store: content-addressed blobs plus one manifest copy per installed version.

Layout::

    <root>/blobs/sha256/<hex>                       artifact bytes, named by their sha256 (read-only)
    <root>/models/<name>/<version>/manifest.json    the registry's manifest, byte for byte = "installed"
    <root>/models/<name>/<version>/manifest.json.sig its signatures, when signed
    <root>/locks/blobs/<hex>.lock                   flock per blob
    <root>/locks/models/<name>@<version>.lock       flock per version

Invariants:
- a file under a blob name always has the manifest's size and sha256 (it is downloaded into a temp
  file in the same directory, hashed while copying, checked, and only then renamed into place);
- a version is installed once its manifest copy exists, and that copy is written last, after every
  blob it names is in place (and after its signature file);
- with a trust policy (signed manifests required), a manifest is checked before any of its
  artifacts is downloaded, and the installed copy again each time it is served: the copy keeps
  the exact bytes that were signed, so the check holds on the box for as long as it is kept;
- pulls of the same blob or version from several threads or processes do the work once (flock);
  a pull holds no store-wide lock while it talks to its registry (it takes the gc lock, shared, only
  to record the version), so a stalled registry holds up neither a clean-up nor other versions'
  pulls; a clean-up leaves a version whose pull is in progress. An exclusive lock's file names its
  holder (pid and what it does) for the error a waiter gives up with.

An installed version is served without asking the registry again (the box keeps working offline);
`pull(verify=True)` and `verify()` re-hash the blobs and catch bit rot, and pull repairs it.

The package: `installed` (InstalledModel, and reading and checking what is installed), `pull`
(pulls and imports), `gc` (removing versions); `ModelStore` here is all three.
"""

from __future__ import annotations

from agent.config import AgentConfig
from agent.registry.signing import TrustPolicy
from agent.store.gc import GcReport, StoreCollector
from agent.store.installed import InstalledModel, StoreReader
from agent.store.pull import BLOB_MODE, PARTIAL_SUFFIX, RATE_OVER_S, Progress, StorePuller

__all__ = [
    "BLOB_MODE",
    "PARTIAL_SUFFIX",
    "RATE_OVER_S",
    "GcReport",
    "InstalledModel",
    "ModelStore",
    "Progress",
    "StoreReader",
    "store_for",
]


def store_for(config: AgentConfig) -> ModelStore:
    """The agent's store (under state_dir) with the trust policy of its `registry.trusted_keys`;
    ConfigError when a trusted key file cannot be loaded."""
    trusted = config.registry.trusted_keys if config.registry is not None else []
    return ModelStore(config.state_dir / "store", trust=TrustPolicy.from_config(trusted))


class ModelStore(StorePuller, StoreCollector):
    """Content-addressed, verified model store; see the package docstring."""
