"""`edge-agent registry publish|keygen|sign`: publish models to a registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.cli.common import echo_json, split_ref, user_errors
from agent.cli.options import (
    AtolOption,
    CaFileOption,
    JsonOption,
    KeyOption,
    PasswordFileOption,
    RegistryUrlOption,
    RtolOption,
    TestDataOption,
    TokenFileOption,
    UsernameOption,
)
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.config import PipelineConfig, RegistryConnection

registry_app = typer.Typer(help="Publish models to a registry.", no_args_is_help=True)


def _connection(
    username: str | None, password_file: Path | None, token_file: Path | None, ca_file: Path | None
) -> RegistryConnection:
    from pydantic import ValidationError

    from agent.config import RegistryConnection

    try:
        return RegistryConnection(
            username=username, password_file=password_file, token_file=token_file, ca_file=ca_file
        )
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise EdgeAgentError(f"registry credentials: {problems}") from None


@registry_app.command("publish")
def registry_publish(
    file: Annotated[
        Path,
        typer.Argument(
            help="Model file (.onnx, .tflite, .xml), or an edge-agent release wheel (.whl).",
            exists=True,
            dir_okay=False,
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Model name.")],
    version: Annotated[str, typer.Option("--version", help="Version (immutable once published).")],
    registry: RegistryUrlOption,
    target: Annotated[str, typer.Option("--target", help="Artifact target, e.g. any, edgetpu.")] = "any",
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="JSON file of metadata for the manifest (labels, ...).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing version.")] = False,
    testdata: TestDataOption = None,
    rtol: RtolOption = None,
    atol: AtolOption = None,
    sign_key: Annotated[
        Path | None,
        typer.Option("--sign", help="Sign the manifest with this Ed25519 private key (registry keygen)."),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(
            "--quantize",
            metavar="int8",
            help="Also publish an int8 variant (onnxruntime static QDQ, per-channel) beside the ONNX model, "
            "kept only where it reports the float model's detections/top-k on the calibration inputs (its "
            "output head kept in float where quantizing it changes them).",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="With --quantize: a folder of images (e.g. frames `edge-agent source --save` wrote) or an "
            ".npz of inputs; default: the --test-data. Images are prepared with --pipeline's preprocess, "
            "else the model's metadata (Ultralytics: letterbox to imgsz), else a plain letterbox to the "
            "model's input, RGB, 0..1.",
            exists=True,
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="With --pipeline: the agent config it is in.")
    ] = None,
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline", help="With --quantize: prepare and judge as this pipeline of -c CONFIG does."
        ),
    ] = None,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    token_file: TokenFileOption = None,
    ca_file: CaFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a model file as NAME@VERSION: copies it in (or pushes it to an OCI registry) with its
    manifest (sha256, size, format of every file)."""
    from agent.registry.file_registry import PublishOptions
    from agent.registry.publish import publish_version
    from agent.registry.signing import key_id, load_private_key

    made = None
    with user_errors(as_json):
        if quantize is None and (calibration is not None or pipeline is not None):
            raise EdgeAgentError("--calibration and --pipeline say how to quantize: add --quantize int8")
        extra = _read_json_file(metadata) if metadata else None
        private_key = load_private_key(sign_key) if sign_key is not None else None  # before any copying
        options = PublishOptions(
            target=target,
            metadata=extra,
            force=force,
            testdata=testdata or [],
            sign_with=private_key,
            rtol=rtol,
            atol=atol,
        )
        connection = _connection(username, password_file, token_file, ca_file)
        if quantize is None:
            manifest, digest = publish_version(registry, file, name, version, options, connection)
        else:
            from agent.quantize import Quantized, make_variant
            from agent.registry.publish import publish_with_variant

            chosen, match_iou = _pipeline(config, pipeline)

            def make(model: Path, out: Path, testdata: list[Path]) -> Quantized:
                return make_variant(model, out, calibration, testdata, chosen, match_iou, _stderr)

            manifest, digest, made = publish_with_variant(
                registry, file, name, version, make, options, connection, precision=quantize
            )
    signed_by = key_id(private_key.public_key()) if private_key is not None else None
    variant = None
    if made is not None:
        variant = {
            "file": made.path.name,
            "precision": quantize,
            "kept_float": made.kept_float,
            "checked_inputs": made.checked,
            "max_diff": made.max_diff,
            "refused_tries": made.tries,
        }
    if as_json:
        echo_json(
            {**json.loads(manifest.to_bytes()), "signed_by": signed_by, "digest": digest, "variant": variant}
        )
    else:
        for artifact in manifest.artifacts:
            kind = f", {artifact.precision} variant of {artifact.made_from}" if artifact.precision else ""
            typer.echo(
                f"published {name}@{version} to {registry}: {artifact.file} "
                f"({artifact.format}{kind}, {artifact.size} bytes, sha256 {artifact.sha256})"
            )
        if made is not None:
            within = f", {made.within()}" if made.max_diff is not None else ""
            typer.echo(
                f"{quantize} variant {made.path.name}: {made.kept_float} kept in float; the same reports as "
                f"the float model on {made.checked} calibration inputs{within}"
            )
        if signed_by:
            typer.echo(f"signed {name}@{version} with key {signed_by}")
        if digest:
            typer.echo(f"image manifest {digest} (pin it with model.digest)")


@registry_app.command("keygen")
def registry_keygen(
    key_file: Annotated[
        Path, typer.Argument(help="Private key file to write (its public key: KEY_FILE.pub).")
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace existing key files.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Make an Ed25519 signing key: KEY_FILE (private, mode 0600) and KEY_FILE.pub (for trusted_keys)."""
    from agent.registry.signing import generate_key

    with user_errors(as_json):
        kid, public_path = generate_key(key_file, force=force)
    if as_json:
        echo_json({"key_id": kid, "private_key": str(key_file), "public_key": str(public_path)})
    else:
        typer.echo(f"key {kid}: private {key_file} (keep it secret), public {public_path}")
        typer.echo(f"trust it on a box: registry.trusted_keys: [{{key: {public_path.name}, models: ['*']}}]")


@registry_app.command("sign")
def registry_sign(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION published in the registry.")],
    registry: RegistryUrlOption,
    key: KeyOption,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    token_file: TokenFileOption = None,
    ca_file: CaFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add a signature to a published version (manifest.json.sig); other keys' signatures are kept."""
    from agent.registry.publish import sign_version
    from agent.registry.signing import load_private_key

    with user_errors(as_json):
        name, version = split_ref(ref)
        connection = _connection(username, password_file, token_file, ca_file)
        kid, digest = sign_version(registry, name, version, load_private_key(key), connection)
    if as_json:
        echo_json({"name": name, "version": version, "signed_by": kid, "digest": digest})
    else:
        typer.echo(f"signed {name}@{version} in {registry} with key {kid}")
        if digest:
            typer.echo(f"image manifest {digest} (the tag {version} now points to it)")


def _stderr(text: str) -> None:
    typer.echo(text, err=True)


def _pipeline(config: Path | None, name: str | None) -> tuple[PipelineConfig | None, float]:
    """The pipeline of -c CONFIG that --pipeline names (None: none named), and the config's match_iou
    (what selection will judge the variant by)."""
    if name is None:
        if config is not None:
            raise EdgeAgentError("-c CONFIG is read for --pipeline's preprocess: add --pipeline NAME")
        from agent.config import SelectionConfig

        return None, SelectionConfig.model_fields["match_iou"].default
    if config is None:
        raise EdgeAgentError("--pipeline names a pipeline of a config: add -c CONFIG")
    from agent.config_loader import load_config

    loaded = load_config(config)
    found = {p.name: p for p in loaded.pipelines}
    if name not in found:
        raise EdgeAgentError(
            f"no pipeline named {name!r} in {config} (its pipelines: {', '.join(sorted(found)) or 'none'})"
        )
    return found[name], loaded.backends.match_iou


def _read_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgeAgentError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise EdgeAgentError(f"{path}: metadata must be a JSON object")
    return data
