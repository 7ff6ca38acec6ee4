"""Reading the deployment files the way their real tools do.

Each reader runs the real implementation where one exists here: Debian's
``docker-compose`` for compose files, hadolint for Dockerfiles, the Kubernetes
OpenAPI schemas bundled in ``kubernetes-validate`` for core objects, and
``@kubernetes-models/keda`` (generated from KEDA's API types, installed by
``make deploy-validators``) for KEDA objects.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KEDA_DIR = Path(__file__).resolve().parent / "keda"
KEDA_TYPES = KEDA_DIR / "node_modules" / "@kubernetes-models" / "keda" / "keda.sh" / "v1alpha1"
# The oldest Kubernetes these manifests are for (preStop sleep needs 1.30+); the
# schemas come bundled with kubernetes-validate.
KUBERNETES_VERSION = "1.31.0"


class ToolMissing(RuntimeError):
    """A validator is not installed; the message says which make target installs it."""


def tool(name: str, installed_by: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolMissing(f"{name} is not on PATH: run `{installed_by}`")
    return path


def compose_config(path: Path, *profiles: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` on a file: the resolved model, or the reason it is invalid."""
    command = [tool("docker-compose", "make system-packages"), "--project-directory", str(ROOT), "-f", str(path)]
    for profile in profiles:
        command += ["--profile", profile]
    return subprocess.run(command + ["config"], capture_output=True, text=True, timeout=60,
                          env=dict(env) if env is not None else None)


def compose_model(path: Path, *profiles: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    result = compose_config(path, *profiles, env=env)
    if result.returncode != 0:
        raise AssertionError(f"docker-compose rejected {path}: {result.stderr.strip()}")
    return yaml.safe_load(result.stdout)


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("hadolint", "pip install -e '.[test]'"), "--no-color", str(path)],
                          capture_output=True, text=True, timeout=60)


def parse_dockerfile(path: Path) -> DockerfileParser:
    # From bytes: given a path, the parser takes a name other than "Dockerfile" for a folder.
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def k8s_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def k8s_documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def validate_k8s(document: dict[str, Any]) -> None:
    """Raises kubernetes_validate's ValidationError (strict: unknown fields fail too)."""
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def validate_keda(documents: list[dict[str, Any]]) -> list[list[str]]:
    """Per document, the errors KEDA's schema and its field names find (empty: valid)."""
    if not (KEDA_DIR / "node_modules").is_dir():
        raise ToolMissing(f"no KEDA validator in {KEDA_DIR}: run `make deploy-validators`")
    result = subprocess.run([tool("node", "make system-packages"), str(KEDA_DIR / "validate.mjs")],
                            input=json.dumps(documents), capture_output=True, text=True, timeout=60,
                            cwd=KEDA_DIR)
    if result.returncode != 0:
        raise RuntimeError(f"validate.mjs failed: {result.stderr.strip()}")
    schema_errors = [entry["errors"] for entry in json.loads(result.stdout)]
    fields = KedaFields(KEDA_TYPES)
    return [errors + fields.unknown(document) for errors, document in zip(schema_errors, documents)]


class KedaFields:
    """The field names of KEDA's types, read from the package's TypeScript declarations.

    The package's validators accept unknown fields (its schemas leave
    additionalProperties open), while ``kubectl apply`` rejects them (strict
    field validation, the default since Kubernetes 1.27). This restores that
    check from the same upstream types.
    """

    _INTERFACE = re.compile(r"^export interface I(\w+)(?: extends [\w, ]+)? \{\n(.*?)\n\}", re.S | re.M)
    _FIELD = re.compile(r'^    "(\w+)"\??: (.+?);?$', re.M)
    _TYPE = re.compile(r"IComGithubKedacoreKedaV2ApisKedaV1alpha1(\w+)")

    def __init__(self, types_dir: Path) -> None:
        self._dir = types_dir
        self._cache: dict[str, dict[str, str | None]] = {}

    def unknown(self, document: dict[str, Any]) -> list[str]:
        return list(self._walk(document, str(document.get("kind")), ""))

    def _fields(self, type_name: str) -> dict[str, str | None]:
        """Field name -> the KEDA type it holds (None: a scalar, a map or a Kubernetes type)."""
        if type_name not in self._cache:
            source = (self._dir / f"{type_name}.d.ts").read_text()
            match = next(m for m in self._INTERFACE.finditer(source) if m.group(1) == type_name)
            self._cache[type_name] = {
                name: (nested.group(1) if (nested := self._TYPE.search(declared)) else None)
                for name, declared in self._FIELD.findall(match.group(2))
            }
        return self._cache[type_name]

    def _walk(self, value: Any, type_name: str, at: str) -> Iterator[str]:
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from self._walk(item, type_name, f"{at}/{index}")
            return
        if not isinstance(value, dict):
            return
        fields = self._fields(type_name)
        for key, item in value.items():
            if key not in fields:
                yield f"{at or '/'} has unknown field {key!r} (KEDA {type_name} has {sorted(fields)})"
            elif fields[key] is not None:
                yield from self._walk(item, fields[key], f"{at}/{key}")


def container_commands(document: dict[str, Any]) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """(container name, ferry arguments, literal env) for each container of a workload."""
    pod = document.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []):
        env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
        yield container["name"], list(container.get("command", [])[1:]) + list(container.get("args", [])), env


def expand_k8s(argument: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args; an unknown variable stays as written, as the kubelet leaves it."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), argument)


def as_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
