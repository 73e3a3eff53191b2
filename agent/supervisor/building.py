"""Building one version's stage on its own thread: pulled (or imported), proven on this box, loaded
and warmed. The `StageBuilder` is given what a build needs (the store, the session pool, the registry
link, the config); the supervisor's side of a build (its phases, their deadlines, a cancel) comes in
as a `BuildProgress`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from agent.attribute_models import AttributeModel, AttributeSet, attribute_pipeline
from agent.backend_choice import Choice, DecisionSwitcher, check_on_testdata, choose_and_load, make_prover
from agent.config import AgentConfig, ModelRef, PipelineConfig
from agent.errors import RegistryError
from agent.model_hints import embedded_hints, with_model_hints
from agent.pipeline import Pipeline
from agent.processing.feed import build_feeder
from agent.registry import open_registry
from agent.session_pool import SessionPool
from agent.sources import Frame, Slot, Source
from agent.stage import LoadedModel, Stage
from agent.store import InstalledModel, ModelStore
from agent.supervisor.state import Cancelled, RegistryLink
from providers import Session

log = logging.getLogger(__package__)  # the package's logger, as before it was split


class BuildProgress(Protocol):
    """What a build reports to (the supervisor's `Change`): `check` raises Cancelled once the change
    was pre-empted or the agent stops; `phase` enters a phase (which has a deadline) and says its
    first step; `step` says what the phase does now; `download` how far a pull got."""

    def check(self) -> None: ...

    def phase(self, phase: str, step: str) -> None: ...

    def step(self, text: str) -> None: ...

    def download(self, what: str, done: int, total: int, rate: float) -> None: ...


def peek_for(
    running: Pipeline | None, source: tuple[Source, Slot] | None
) -> Callable[[float], Frame | None] | None:
    """Where a frame to prove backends on comes from without costing the pipeline one: the running
    pipeline's last frame, or the source opened early; None: open the source a second time."""
    if running is not None:
        last = running.last_frame
        if last is not None:
            return lambda _timeout: last
        return running.slot.peek
    if source is not None:
        return source[1].peek
    return None


class StageBuilder:
    """Builds a version's stage: the part of a change its build thread runs."""

    def __init__(
        self,
        store: ModelStore,
        sessions: SessionPool,
        registry_link: RegistryLink,
        config: Callable[[], AgentConfig],
    ) -> None:
        """`config()`: the agent's config now (a reload may change it between two builds)."""
        self.store = store
        self.sessions = sessions
        self.registry_link = registry_link
        self._config = config

    def build(
        self,
        config: PipelineConfig,
        progress: BuildProgress,
        peek: Callable[[float], Frame | None] | None,
        first: bool = False,
        verify: bool = False,
    ) -> Stage:
        """The stage of pipeline `config`, built and warmed. `first`: nothing serves in this slot yet,
        so an unproven model starts on the CPU reference at once (backends.prove_in_background); a new
        version beside a serving one takes the time to be proven first. `verify`: re-hash the installed
        blobs (after a failure: a bit-rotted file of the right size would otherwise fail to load for
        ever; the first attempt trusts sizes, a fast start)."""
        agent = self._config()
        model = config.model
        progress.phase("pulling", f"pulling {model.name}@{model.version}")
        installed = self._install(agent, model, progress, verify)
        progress.check()
        # Preprocessing, state and labels the version ships (manifest), then the file's own metadata.
        config = hinted(config, installed)
        progress.phase("validating", f"proving backends for {installed.ref}")
        prove_later = first and agent.backends.prove_in_background
        session, choice = self._choose(agent, config, installed, progress, peek, prove_later)
        decision, testdata = choice.decision, installed.testdata_artifacts()
        try:
            if not decision.checked:  # no trials ran: the version's own test data proves the choice
                check_on_testdata(session, choice, testdata)
        except Exception:
            session.close()
            raise
        log.info("pipeline %s: %s", config.name, decision.explain())
        loaded = LoadedModel(
            installed.name, installed.version, decision.artifact_sha256, session, decision, choice.key
        )
        try:
            progress.check()
            progress.phase("building", f"warming up on {session.backend}")
            prove = None
            if choice.policy.benchmark and not decision.checked:  # no sample at build time: a frame will do
                prove = make_prover(agent, config, choice, testdata)
            feeder = build_feeder(config, session.inputs, session.outputs)
            switcher = DecisionSwitcher(
                decision,
                choice.artifacts,
                choice.policy,
                warm_up=feeder.warm_up_feeds(),
                backends=choice.box.backends,
                prove=prove,
            )
            attributes = None
            if config.attributes:  # second models: one that cannot serve is left out, said in status
                attributes = self._attributes(agent, config, progress, peek, verify)
            try:
                stage = Stage(config, loaded, switcher, feeder, attributes)
                stage.warm_up()
            except Exception:
                if attributes is not None:
                    attributes.release()
                raise
        except Exception:
            session.close()
            raise
        return stage

    def attributes_for(
        self,
        config: PipelineConfig,
        progress: BuildProgress,
        peek: Callable[[float], Frame | None] | None,
        verify: bool = False,
    ) -> AttributeSet:
        """Only the second models of `config` (a change to its attributes alone: the primary serves on)."""
        progress.phase("pulling", f"pulling the second models of {config.name}")
        return self._attributes(self._config(), config, progress, peek, verify)

    def _choose(
        self,
        agent: AgentConfig,
        config: PipelineConfig,
        installed: InstalledModel,
        progress: BuildProgress,
        peek: Callable[[float], Frame | None] | None,
        prove_later: bool = False,
    ) -> tuple[Session, Choice]:
        """The backend choice for an installed model under `config`, proven and loaded."""
        return choose_and_load(
            agent,
            config,
            installed.model_artifacts(),
            installed.ref,
            installed.testdata_artifacts(),
            progress=progress.step,
            load=self.sessions.load,
            peek=peek,
            prove_later=prove_later,
        )

    def _install(
        self, agent: AgentConfig, model: ModelRef, progress: BuildProgress, verify: bool
    ) -> InstalledModel:
        """The model in the store: imported from its file, or pulled from the registry."""
        if model.path is not None:
            return self.store.import_file(model.path, model.name, model.version)
        assert agent.registry is not None  # the config model requires it for registry models
        asks_registry = not self.store.is_installed(model.name, model.version)
        registry = open_registry(agent.registry.url, agent.registry)
        try:
            installed = self.store.pull(
                registry,
                model.name,
                model.version,
                verify=verify,
                progress=progress.download,
                digest=model.digest,
            )
        except RegistryError as exc:
            self.registry_link.failed(registry.url, exc, self.store)
            raise
        finally:
            registry.close()
        if asks_registry:
            self.registry_link.reached(registry.url)
        return installed

    def _attributes(
        self,
        agent: AgentConfig,
        config: PipelineConfig,
        progress: BuildProgress,
        peek: Callable[[float], Frame | None] | None,
        verify: bool,
    ) -> AttributeSet:
        """The pipeline's second models, each pulled, hinted, proven on this box and loaded as the
        pipeline's own model is. One that cannot be had is left out and said (status, the log): the
        primary model serves on without it."""
        models: list[AttributeModel] = []
        problems: dict[str, str] = {}
        for attribute in config.attributes:
            ref = f"{attribute.model.name}@{attribute.model.version}"
            progress.step(f"attribute {attribute.name}: pulling {ref}")
            try:
                installed = self._install(agent, attribute.model, progress, verify)
                progress.check()
                attribute_config = hinted(attribute_pipeline(config, attribute), installed)
                progress.step(f"attribute {attribute.name}: proving backends for {installed.ref}")
                session, choice = self._choose(agent, attribute_config, installed, progress, peek)
                decision = choice.decision
                loaded = LoadedModel(
                    installed.name, installed.version, decision.artifact_sha256, session, decision, choice.key
                )
                loaded.acquire()
                try:
                    if not decision.checked:
                        check_on_testdata(session, choice, installed.testdata_artifacts())
                    models.append(AttributeModel.hinted(attribute, attribute_config, loaded))
                except Exception:
                    loaded.release()
                    session.close()
                    raise
                log.info("pipeline %s: attribute %s: %s", config.name, attribute.name, decision.explain())
            except Cancelled:
                for model in models:
                    model.model.release()
                    model.model.session.close()
                raise
            except Exception as exc:  # the primary serves on without this one
                why = f"{ref} cannot serve: {exc}"
                log.warning("pipeline %s: attribute %s: %s", config.name, attribute.name, why)
                problems[attribute.name] = why
        return AttributeSet(config.name, models, problems)


def hinted(config: PipelineConfig, installed: InstalledModel) -> PipelineConfig:
    """`config` completed by the preprocessing, state and labels the version ships (its manifest), then
    by the model file's own metadata."""
    return with_model_hints(config, installed.manifest, embedded_hints(installed.model_artifacts()))
