"""`postprocess: {type: embedding}`: a model's vector, L2-normalised, and backend candidates judged
on its direction (cosine similarity), on a real embedding model: eigenfaces, a PCA fitted on
scikit-image's real face crops (lfw_subset) and exported to ONNX with skl2onnx."""

from __future__ import annotations

import numpy as np
import pytest

from agent.config.processing import EmbeddingPostprocess
from agent.errors import ModelError
from agent.processing.judge import MIN_COSINE, judged_on, report_judge
from agent.processing.postprocess import Embedding, build_postprocessor
from providers import ModelArtifact, Session, TensorSpec, get_backend

SPEC = [TensorSpec("features", (1, 4), "float32")]


def test_the_vector_is_normalised_and_its_length_reported() -> None:
    post = build_postprocessor(EmbeddingPostprocess(type="embedding"), SPEC)
    assert post({"features": np.array([[3.0, 0.0, -4.0, 0.0]], np.float32)}) == {
        "embedding": [0.6, 0.0, -0.8, 0.0],
        "norm": 5.0,
    }
    # Five decimal places; [D] and [1, D, 1, 1] are one vector too.
    third = post({"features": np.array([1.0, 1.0, 1.0, 0.0], np.float32)})
    assert third["embedding"] == [0.57735, 0.57735, 0.57735, 0.0]
    assert post({"features": np.ones((1, 4, 1, 1), np.float32)})["embedding"] == [0.5] * 4
    # As the model gives it; an all-zero vector has no direction and stays zero.
    raw = Embedding(EmbeddingPostprocess(type="embedding", normalize=False), SPEC)
    assert raw({"features": np.array([[3.0, 0.0, -4.0, 0.0]], np.float32)})["embedding"] == [
        3.0,
        0.0,
        -4.0,
        0.0,
    ]
    assert post({"features": np.zeros((1, 4), np.float32)}) == {"embedding": [0.0] * 4, "norm": 0.0}


def test_a_batch_is_read_by_rows_and_bad_values_are_errors() -> None:
    post = Embedding(EmbeddingPostprocess(type="embedding"), SPEC)
    batch = np.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0]], np.float32)
    assert [r["norm"] for r in post.rows({"features": batch})] == [1.0, 2.0]
    with pytest.raises(ModelError, match=r"batch size 2, expected 1 \(read batches by rows\)"):
        post({"features": batch})
    with pytest.raises(ModelError, match="output 'features' contains NaN or infinite values"):
        post({"features": np.array([[1.0, np.inf, 0, 0]], np.float32)})
    with pytest.raises(ModelError, match=r"postprocess.output 'emb' is not a model output"):
        Embedding(EmbeddingPostprocess(type="embedding", output="emb"), SPEC)


@pytest.fixture(scope="module")
def eigenfaces(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelArtifact, np.ndarray]:
    """(a 16-dimensional face embedding as ONNX, the 100 face crops it was fitted on, flattened)."""
    from skimage.data import lfw_subset
    from skl2onnx import to_onnx
    from sklearn.decomposition import PCA

    faces = lfw_subset()[:100].reshape(100, -1).astype(np.float32)  # the first 100 are faces
    pca = PCA(n_components=16, random_state=0).fit(faces)
    path = tmp_path_factory.mktemp("eigenfaces") / "eigenfaces.onnx"
    path.write_bytes(to_onnx(pca, faces[:1], target_opset=17).SerializeToString())
    return ModelArtifact(path, "onnx", "e" * 64, name=path.name), faces


def _run(backend: str, artifact: ModelArtifact, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session: Session = get_backend(backend).load(artifact)
    try:
        return session.run(feeds)
    finally:
        session.close()


def test_a_backend_is_judged_on_the_direction_of_its_vectors(
    eigenfaces: tuple[ModelArtifact, np.ndarray],
) -> None:
    artifact, faces = eigenfaces
    session = get_backend("onnxruntime/CPUExecutionProvider").load(artifact)
    try:
        inputs, outputs = session.inputs, session.outputs
        reference = session.run({inputs[0].name: faces[:4]})
        other_faces = session.run({inputs[0].name: faces[4:8]})
    finally:
        session.close()
    config = EmbeddingPostprocess(type="embedding")
    judge = report_judge(config, outputs)
    assert judge is not None and judged_on(config) == "embedding"
    # OpenVINO's eigenfaces point where onnxruntime's do.
    verdict = judge(_run("openvino/CPU", artifact, {inputs[0].name: faces[:4]}), reference)
    assert verdict is not None and verdict[1] == "" and verdict[0] is not None and verdict[0] < 1e-3
    # Other faces' embeddings are refused, the similarity said.
    verdict = judge(other_faces, reference)
    assert verdict is not None and verdict[0] is not None and verdict[0] > 1 - MIN_COSINE
    lowest = 1 - verdict[0]
    assert verdict[1] == (
        f"gives other embeddings than the reference (cosine similarity {lowest:.4f}, at least 0.99 needed)"
    )
    # A vector of another length is no embedding of the same model.
    shorter = {outputs[0].name: reference[outputs[0].name][:, :8]}
    assert judge(shorter, reference) == (None, "gives [4, 8] vectors where the reference gives [4, 16]")
