"""Getting versions out: `remove` one version, `gc` by count, age and size; blobs no installed
version names (and their partial downloads and upgraded twins) go with them."""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.errors import StoreError
from agent.fsutil import fsync_dir
from agent.registry.file_registry import check_name
from agent.registry.manifest import MANIFEST_FILE
from agent.store.installed import InstalledModel, StoreReader

log = logging.getLogger(__package__)  # the package's logger, as before it was split


@dataclass
class GcReport:
    """What `ModelStore.gc` / `remove` took out (or, dry, would)."""

    removed: builtins.list[dict[str, str]] = field(default_factory=builtins.list)  # name, version, why
    blobs: int = 0
    freed_bytes: int = 0
    dry_run: bool = False


class StoreCollector(StoreReader):
    """Removing versions from the store."""

    # --- removing ---------------------------------------------------------------------------

    def remove(self, name: str, version: str) -> GcReport:
        """Uninstall one version and delete the blobs no other installed version uses."""
        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        with self._gc_lock():
            if self._installed_manifest(name, version, quiet=True) is None:
                installed = ", ".join(m.version for m in self.list() if m.name == name) or "none"
                raise StoreError(
                    f"model {name}@{version} is not installed in store {self.root} "
                    f"(installed versions of {name}: {installed})"
                )
            report = GcReport()
            self._uninstall(name, version, "removed on request", report, busy_ok=False)
            self._delete_unused_blobs(report)
        return report

    def gc(
        self,
        in_use: Iterable[tuple[str, str]] = (),
        keep_versions: int | None = None,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        dry_run: bool = False,
        wait_s: float | None = None,
    ) -> GcReport:
        """Remove versions beyond the newest `keep_versions` of each model (by install time), those
        installed more than `max_age_s` ago, and then the oldest while the store holds more than
        `max_bytes`; never one in `in_use` (name, version). Then delete blobs no installed version
        uses, stale partial downloads of those, and upgraded twins of deleted blobs. `dry_run`
        says what would go. `wait_s`: how long to wait for pulls in progress (default: the store's
        lock timeout); StoreError when they take longer."""
        keep = set(in_use)
        report = GcReport(dry_run=dry_run)
        with self._gc_lock(wait_s=wait_s):
            installed = sorted(self.list(), key=self._installed_at, reverse=True)  # newest first
            going: dict[tuple[str, str], str] = {}
            seen: dict[str, int] = {}
            now = time.time()
            for model in installed:
                seen[model.name] = seen.get(model.name, 0) + 1
                key = (model.name, model.version)
                if key in keep:
                    continue
                if keep_versions is not None and seen[model.name] > keep_versions:
                    going[key] = f"more than {keep_versions} version(s) of {model.name} installed"
                elif max_age_s is not None and now - self._installed_at(model) > max_age_s:
                    going[key] = f"installed more than {max_age_s / 86400:g} day(s) ago"
            if max_bytes is not None:
                staying = [m for m in installed if (m.name, m.version) not in going]
                for model in reversed(staying):  # oldest first
                    if self._bytes_of(staying) <= max_bytes:
                        break
                    if (model.name, model.version) in keep:
                        continue
                    going[(model.name, model.version)] = f"the store holds more than {max_bytes:,} bytes"
                    staying = [m for m in staying if m is not model]
            for (name, version), why in going.items():
                self._uninstall(name, version, why, report)
            self._delete_unused_blobs(report)
        return report

    def _installed_at(self, model: InstalledModel) -> float:
        """When a version was installed: its manifest copy is written last, once."""
        try:
            return (self.models_dir / model.name / model.version / MANIFEST_FILE).stat().st_mtime
        except OSError:
            return 0.0

    def _bytes_of(self, models: Iterable[InstalledModel]) -> int:
        blobs = {a.sha256: a.size for m in models for a in m.manifest.artifacts}
        return sum(blobs.values())

    def _uninstall(self, name: str, version: str, why: str, report: GcReport, busy_ok: bool = True) -> None:
        """Remove one version; one a pull holds (in progress, maybe stalled on its registry) is left
        as it is when `busy_ok` (a clean-up), else StoreError naming the pull."""
        if report.dry_run:
            report.removed.append({"name": name, "version": version, "why": why})
            return
        version_dir = self.models_dir / name / version
        lock = self.locks_dir / "models" / f"{name}@{version}.lock"
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._lock(lock, f"removing {name}@{version}", wait_s=0))
            except StoreError as exc:
                if not busy_ok:
                    raise
                log.info("clean-up: keeping %s@%s for now (%s)", name, version, exc.message)
                return
            report.removed.append({"name": name, "version": version, "why": why})
            try:
                os.unlink(version_dir / MANIFEST_FILE)  # first: from here on it is not installed
                fsync_dir(version_dir)
                shutil.rmtree(version_dir)
                with contextlib.suppress(OSError):  # only when no other version is left
                    os.rmdir(version_dir.parent)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot remove {name}@{version} from {version_dir}: {exc}") from None
        log.info("removed %s@%s from the store (%s)", name, version, why)

    def _delete_unused_blobs(self, report: GcReport) -> None:
        """Blobs (and partial downloads, and upgraded twins) no installed version names. Called
        under the exclusive gc lock: no pull is adding a version meanwhile."""
        going = {(r["name"], r["version"]) for r in report.removed}
        used = {
            a.sha256 for m in self.list() if (m.name, m.version) not in going for a in m.manifest.artifacts
        }
        if not self.blobs_dir.is_dir():
            return
        for path in sorted(self.blobs_dir.iterdir()):
            digest = path.name.split(".", 1)[0]
            if digest in used or len(digest) != 64 or ".partial" in path.name:
                continue  # a partial download stays for the pull that resumes it
            report.freed_bytes += path.stat().st_size
            report.blobs += 0 if path.name != digest else 1
            if not report.dry_run:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(path, 0o644)
                    os.unlink(path)
            for twin in (self.root / "derived").glob(f"{digest}-*"):
                report.freed_bytes += twin.stat().st_size
                if not report.dry_run:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(twin)
