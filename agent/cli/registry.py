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
    from agent.config import RegistryConnection

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

    with user_errors(as_json):
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
        manifest, digest = publish_version(registry, file, name, version, options, connection)
    signed_by = key_id(private_key.public_key()) if private_key is not None else None
    if as_json:
        echo_json({**json.loads(manifest.to_bytes()), "signed_by": signed_by, "digest": digest})
    else:
        for artifact in manifest.artifacts:
            typer.echo(
                f"published {name}@{version} to {registry}: {artifact.file} "
                f"({artifact.format}, {artifact.size} bytes, sha256 {artifact.sha256})"
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


def _read_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgeAgentError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise EdgeAgentError(f"{path}: metadata must be a JSON object")
    return data
