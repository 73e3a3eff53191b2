"""`postprocess: {type: ctc}`: greedy CTC decoding of a text recognizer's per-step probabilities,
its character list from the model's own metadata (PP-OCR rec's `character`), a list that does not
fit the output refused at build time and by `config validate` at its line, and backend candidates
judged on the text they read (the real PP-OCR rec on OpenVINO against onnxruntime)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.config.processing import CtcPostprocess
from agent.errors import ModelError
from agent.model_hints import embedded_hints, with_model_hints
from agent.processing import Preprocessor
from agent.processing.judge import judged_on, report_judge
from agent.processing.postprocess import Ctc, build_postprocessor
from agent.registry.manifest import Manifest
from providers import Session, TensorSpec, get_backend
from tests.config_cases import validate_cli
from tests.text_lines import REC_OUTPUT, REC_PREPROCESS, cv2_line, rec_artifact, rec_model, rec_postprocess

CHARACTERS = ["a", "b", "l", "o", " "]  # classes: 0 the blank, 1 a, 2 b, 3 l, 4 o, 5 ' '
SPEC = [TensorSpec("probs", (1, 12, 6), "float32")]


def steps(*classes: int, best: float = 0.9) -> np.ndarray:
    """[1, T, 6] probabilities whose best class at step t is classes[t], with probability `best`."""
    probs = np.full((1, len(classes), 6), (1 - best) / 5, np.float32)
    probs[0, np.arange(len(classes)), classes] = best
    return probs


def test_greedy_decoding_merges_repeats_then_drops_blanks() -> None:
    post = build_postprocessor(CtcPostprocess(type="ctc", characters=CHARACTERS), SPEC)
    # b b - a - l l - l o: a run of one class is one character, unless a blank parts it.
    assert post({"probs": steps(2, 2, 0, 1, 0, 3, 3, 0, 3, 4, 0)}) == {"text": "ballo", "score": 0.9}
    probs = steps(2, 1, 3, 3, 0, 3)
    probs[0, 0, 2] = 0.5  # the score: the mean of the kept steps' best probability
    assert post({"probs": probs}) == {"text": "ball", "score": round((0.5 + 3 * 0.9) / 4, 4)}
    # Only blanks: no text, score 0. Spaces at either end are the crop's margin, not its text.
    assert post({"probs": steps(0, 0, 0)}) == {"text": "", "score": 0.0}
    assert post({"probs": steps(5, 0, 1, 5, 2, 0, 5)}) == {"text": "a b", "score": 0.9}
    assert post({"probs": steps(5, 5, 0, 5)}) == {"text": "", "score": 0.0}
    assert post({"probs": steps(1, 2)[0]}) == {"text": "ab", "score": 0.9}  # [T, C], no batch axis


def test_the_blank_may_be_any_class_and_logits_take_softmax() -> None:
    # The blank last: class 0 is "a" ... class 4 is " ", class 5 the blank.
    post = Ctc(CtcPostprocess(type="ctc", characters=CHARACTERS, blank=5, softmax=True), SPEC)
    logits = np.log(steps(0, 5, 0, 2, 2, 5, 3)) + 7.0  # log-probabilities shifted: softmax undoes both
    result = post({"probs": logits})
    assert result["text"] == "aalo" and result["score"] == pytest.approx(0.9, abs=1e-4)


def test_a_batch_is_read_by_rows_and_a_single_read_wants_one_row() -> None:
    post = Ctc(CtcPostprocess(type="ctc", characters=CHARACTERS), SPEC)
    batch = np.concatenate([steps(1, 0, 1), steps(2, 4, 3)])
    assert post.rows({"probs": batch}) == [{"text": "aa", "score": 0.9}, {"text": "bol", "score": 0.9}]
    with pytest.raises(
        ModelError, match=r"output 'probs' has batch size 2, expected 1 \(read batches by rows\)"
    ):
        post({"probs": batch})
    nan = steps(1, 2)
    nan[0, 1, 3] = np.nan
    with pytest.raises(ModelError, match="output 'probs' contains NaN or infinite values"):
        post({"probs": nan})


def test_a_character_list_that_does_not_fit_the_output_is_refused_with_both_numbers() -> None:
    with pytest.raises(ModelError) as info:
        Ctc(
            CtcPostprocess(type="ctc", characters=["0", "1", "2"]),
            [TensorSpec(REC_OUTPUT, ("n", "t", 6625), "float32")],
        )
    assert info.value.message == (
        "postprocess.characters: 3 characters and the blank make 4 classes, "
        f"but output '{REC_OUTPUT}' has 6625"
    )
    # An output whose width is open is checked on its first run.
    post = Ctc(
        CtcPostprocess(type="ctc", characters=CHARACTERS), [TensorSpec("probs", (1, "t", "c"), "float32")]
    )
    with pytest.raises(
        ModelError, match="5 characters and the blank make 6 classes, but output 'probs' has 7"
    ):
        post({"probs": np.zeros((1, 4, 7), np.float32)})
    with pytest.raises(ModelError, match="a CTC output is"):
        Ctc(CtcPostprocess(type="ctc", characters=CHARACTERS), [TensorSpec("probs", (1, 1, 4, 6), "float32")])
    with pytest.raises(ModelError, match=r"postprocess\.characters is not set and the model names none"):
        Ctc(CtcPostprocess(type="ctc"), SPEC)
    with pytest.raises(ValidationError, match=r"blank \(6\) must be a class index: 0..5 for 5 characters"):
        CtcPostprocess(type="ctc", characters=CHARACTERS, blank=6)


def test_the_recognizer_names_its_characters_in_its_own_metadata() -> None:
    pipeline = PipelineConfig.model_validate(
        {
            "name": "reader",
            "model": {"path": str(rec_model())},
            "source": {"type": "video", "uri": "/dev/video0"},
            "preprocess": REC_PREPROCESS.model_dump(),
            "postprocess": {"type": "ctc"},
        }
    )
    filled = with_model_hints(pipeline, None, embedded_hints([rec_artifact()]))
    assert isinstance(filled.postprocess, CtcPostprocess) and filled.postprocess.characters is not None
    # PaddleOCR's dictionary (6623 lines) and the ' ' it appends: with the blank, the 6625 classes.
    assert len(filled.postprocess.characters) == 6624 and filled.postprocess.characters[-1] == " "
    Ctc(filled.postprocess, [TensorSpec(REC_OUTPUT, ("n", "t", 6625), "float32")])
    # A manifest's `characters` come before the file's own (as its labels do).
    manifest = Manifest.model_validate(
        {
            "schema_version": 1,
            "name": "rec",
            "version": "1",
            "created": "2026-11-29T00:00:00Z",
            "artifacts": [{"file": "m.onnx", "sha256": "ab" * 32, "size": 1, "format": "onnx"}],
            "metadata": {"characters": CHARACTERS},
        }
    )
    listed = with_model_hints(pipeline, manifest, embedded_hints([rec_artifact()])).postprocess
    assert isinstance(listed, CtcPostprocess) and listed.characters == CHARACTERS
    # What the pipeline writes wins.
    written = pipeline.model_copy(update={"postprocess": CtcPostprocess(type="ctc", characters=CHARACTERS)})
    assert (
        with_model_hints(written, None, embedded_hints([rec_artifact()])).postprocess == written.postprocess
    )


def _reader(postprocess: str) -> str:
    return (
        "device: {id: box-1}\n"
        "pipelines:\n"
        "  - name: reader\n"
        f"    model: {{path: {rec_model()}}}\n"
        "    source: {type: video, uri: /dev/video0}\n"
        "    preprocess:\n"
        "      {color: bgr, mean: [0.5], std: [0.5], resize: {width: 320, height: 48, mode: height}}\n"
        f"{postprocess}"
    )


def test_config_validate_names_the_line_of_characters_that_do_not_fit_the_model(tmp_path: Path) -> None:
    code, lines = validate_cli(
        tmp_path, _reader("    postprocess:\n      type: ctc\n      characters: [a, b, c]\n")
    )
    assert code != 0
    assert lines == [
        f"10: pipelines[0].postprocess.characters: 3 characters and the blank make 4 classes, "
        f"but output '{REC_OUTPUT}' has 6625"
    ]
    code, lines = validate_cli(tmp_path, _reader("    postprocess:\n      type: ctc\n      blank: 6624\n"))
    assert (code, lines) == (0, [])  # the model's own characters fit, and the blank may be the last class
    assert validate_cli(tmp_path, _reader("    postprocess: {type: ctc}\n")) == (0, [])


@pytest.fixture(scope="module")
def rec_session() -> Iterator[Session]:
    session = get_backend("onnxruntime/CPUExecutionProvider").load(rec_artifact())
    yield session
    session.close()


def test_a_backend_is_judged_on_the_text_it_reads(rec_session: Session) -> None:
    preprocess = Preprocessor(REC_PREPROCESS, rec_session.inputs)
    lines = [cv2_line("EDGE CAMERA 42", 1.0), cv2_line("Gate B", 0.6, thickness=1)]
    batch = np.concatenate([preprocess(line) for line in lines])
    judge = report_judge(rec_postprocess(), rec_session.outputs)
    assert judge is not None and judged_on(rec_postprocess()) == "text"
    reference = rec_session.run({"x": batch})
    # OpenVINO at its default precision on this CPU (bf16 where it has it) reads both lines as
    # onnxruntime does: a candidate the selection keeps.
    candidate = get_backend("openvino/CPU").load(rec_artifact())
    try:
        assert judge(candidate.run({"x": batch}), reference) == (0.0, "")
    finally:
        candidate.close()
    # One whose outputs read something else (here: the lines the other way round) is refused.
    swapped = rec_session.run({"x": batch[::-1].copy()})
    assert judge(swapped, reference) == (
        2.0,
        "reads other text than the reference in 2 of 2 rows "
        "('Gate B' where the reference reads 'EDGE CAMERA 42')",
    )
    # A reference that makes no text (NaN) leaves the judging to the tensors.
    assert judge(reference, {REC_OUTPUT: np.full_like(reference[REC_OUTPUT], np.nan)}) is None


def test_an_attributes_characters_are_checked_against_its_model_at_their_line(tmp_path: Path) -> None:
    text = (
        "device: {id: box-1}\n"
        "pipelines:\n"
        "  - name: signs\n"
        "    model: {path: /opt/det.onnx}\n"
        "    source: {type: video, uri: /srv/signs.mp4}\n"
        "    postprocess: {type: detection, labels: [sign]}\n"
        "    attributes:\n"
        "      - name: text\n"
        f"        model: {{path: {rec_model()}}}\n"
        "        preprocess: {color: bgr, resize: {width: 320, height: 48, mode: height}}\n"
        "        postprocess:\n"
        "          type: ctc\n"
        "          characters: ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']\n"
    )
    code, lines = validate_cli(tmp_path, text)
    assert code != 0
    assert lines == [
        "13: pipelines[0].attributes[0].postprocess.characters: 10 characters and the blank make 11 "
        f"classes, but output '{REC_OUTPUT}' has 6625"
    ]
