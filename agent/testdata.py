"""A model version's test data: inputs its publisher ships in the manifest (and, optionally, the
outputs they must give), so that selection proves backends on inputs the model is made for even
before the pipeline's source delivers a frame.

The file is a NumPy `.npz` archive, an artifact of format "test-data" (hashed and verified like
the model files). Each array named after a model input is that input's value; an array named
`expected:<output name>` is what that output must be (within the selection tolerances). Arrays
are plain numbers (no pickled objects: `np.load(allow_pickle=False)`).

    np.savez("inputs.npz", x=image_batch, **{"expected:softmax_0.tmp_0": probabilities})
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.errors import ModelError
from providers import Backend, BackendError, ModelArtifact
from providers.base import one_line
from providers.select import Sample, SelectionPolicy, compare_outputs, feeds_problem, reference_session

log = logging.getLogger(__name__)

EXPECTED_PREFIX = "expected:"
FORMAT = "test-data"
_NUMERIC_KINDS = frozenset("biufc")  # bool, int, uint, float, complex


def load_testdata(path: Path, label: str | None = None) -> Sample:
    """Read a test data archive; ModelError says what is wrong with it (`label` names it)."""
    label = label or path.name
    feeds: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}
    try:
        with path.open("rb") as f:
            if f.read(6) == b"\x93NUMPY":
                raise ModelError(f"{label} is not valid test data: a single .npy array, not an .npz archive")
        if not zipfile.is_zipfile(path):  # else numpy takes any other file for a pickle
            raise ModelError(f"{label} is not valid test data: not a NumPy .npz archive (no zip structure)")
        archive = np.load(path, allow_pickle=False)
        with archive:  # a zip file: np.load gave an NpzFile
            for key in archive.files:
                value = archive[key]
                if not isinstance(value, np.ndarray):  # a zip member that is no .npy array
                    raise ModelError(f"{label} is not valid test data: member {key!r} is not a NumPy array")
                if value.dtype.kind not in _NUMERIC_KINDS:
                    raise ModelError(
                        f"{label} is not valid test data: array {key!r} holds {value.dtype}, not numbers"
                    )
                if key.startswith(EXPECTED_PREFIX):
                    expected[key.removeprefix(EXPECTED_PREFIX)] = value
                else:
                    feeds[key] = value
    except ModelError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{label} is not valid test data (a NumPy .npz archive): {one_line(exc)}") from None
    if not feeds:
        raise ModelError(
            f"{label} is not valid test data: no input arrays "
            f"(it has {', '.join(map(repr, expected)) or 'no arrays'}; "
            "name each input array after the model input it feeds)"
        )
    return Sample(feeds, f"test data {label}", expected or None)


def testdata_samples(
    testdata: Sequence[tuple[ModelArtifact, str | None]],
    models: Sequence[ModelArtifact],
    backends: Sequence[Backend],
) -> list[Sample]:
    """Samples from the test data artifacts, each marked with the model artifacts it fits.

    `testdata` pairs each archive with the model file it is for (None: any that it fits). An
    archive that cannot be read or fits no artifact is left out with a warning: selection then
    proves the model on the pipeline's own input, as without test data.
    """
    if not testdata:
        return []
    specs = {}
    for model in models:
        try:
            session = reference_session([model], backends)
        except BackendError:
            continue  # no CPU backend reads it: it is proven on other inputs or not at all
        try:
            specs[model.sha256] = session.inputs
        finally:
            session.close()
    samples = []
    for artifact, model_file in testdata:
        try:
            sample = load_testdata(artifact.path, artifact.label)
        except ModelError as exc:
            log.warning("ignoring test data: %s", exc)
            continue
        meant = [m for m in models if model_file is None or model_file in (m.name, m.derived_from)]
        problems = {m.label: feeds_problem(specs[m.sha256], sample.feeds) for m in meant if m.sha256 in specs}
        fits = frozenset(m.sha256 for m in meant if problems.get(m.label) == "")
        if not fits:
            why = "; ".join(f"{name}: {problem}" for name, problem in problems.items()) or (
                f"no model file {model_file!r} in this version"
                if model_file
                else "no model file to check it on"
            )
            log.warning("ignoring test data %s: it fits no model file (%s)", artifact.label, why)
            continue
        samples.append(Sample(sample.feeds, sample.origin, sample.expected, fits))
    return samples


def testdata_problem(model: ModelArtifact, sample: Sample, backends: Sequence[Backend] | None = None) -> str:
    """What is wrong with `sample` as test data of `model` ("" if nothing): its inputs must fit, and
    its expected outputs must be what a plain CPU backend computes from them. BackendError when
    no CPU backend here can read the model."""
    session = reference_session([model], backends)
    try:
        problem = feeds_problem(session.inputs, sample.feeds)
        if problem or not sample.expected:
            return problem
        outputs = session.run(sample.feeds)
    finally:
        session.close()
    _diff, problem = compare_outputs(outputs, sample.expected, SelectionPolicy())
    if problem:
        return f"its expected outputs are not what {model.label} computes on {session.backend}: {problem}"
    return ""
