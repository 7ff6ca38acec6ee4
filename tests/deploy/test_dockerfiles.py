"""The Dockerfiles, linted by hadolint and read by dockerfile-parse."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT, hadolint, parse_dockerfile

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]

BAD = """\
FROM python:latest
RUN apt-get update && apt-get install -y curl
RUN pip install ferry
ADD . /app
CMD ferry serve --model-repository /models
"""


def final_stage(path: Path) -> list[dict]:
    instructions = parse_dockerfile(path).structure
    start = max(i for i, item in enumerate(instructions) if item["instruction"] == "FROM")
    return [item for item in instructions[start:] if item["instruction"] != "COMMENT"]


def image_problems(path: Path) -> list[str]:
    """What keeps a Dockerfile from being a ferry image: pins, user, ports, health, entrypoint."""
    problems = []
    for image in parse_dockerfile(path).parent_images:
        name, _, tag = image.partition(":")
        if not tag or tag == "latest" or not any(c.isdigit() for c in tag):
            problems.append(f"base image {image} is not pinned to a version")
    stage = final_stage(path)
    values = {item["instruction"]: item["value"] for item in stage}
    user = values.get("USER", "root").split(":")[0]
    if not user.isdigit() or int(user) == 0:
        problems.append(f"final stage runs as {user!r}, not a numeric non-root user")
    if set(values.get("EXPOSE", "").split()) != {"8000", "8001", "8002"}:
        problems.append(f"EXPOSE {values.get('EXPOSE')!r}: expected 8000, 8001 and 8002")
    if "/v2/health/live" not in values.get("HEALTHCHECK", ""):
        problems.append("no HEALTHCHECK on /v2/health/live")
    try:
        entrypoint = json.loads(values.get("ENTRYPOINT", "null"))
    except json.JSONDecodeError:
        entrypoint = None
    if entrypoint != ["ferry"]:
        problems.append(f"ENTRYPOINT {values.get('ENTRYPOINT')!r} is not the exec form [\"ferry\"]")
    if not any(i["instruction"] == "COPY" and i["value"].split()[-1] == "/models" for i in stage):
        problems.append("model_repo is not copied to /models")
    return problems


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    result = hadolint(ROOT / name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_known_bad_dockerfile(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(BAD)
    result = hadolint(path)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3013", "DL3020", "DL3025"):
        assert rule in result.stdout, f"hadolint missed {rule}: {result.stdout}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_is_a_pinned_non_root_ferry_with_health_and_models(name: str) -> None:
    assert image_problems(ROOT / name) == []


def test_the_image_checks_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(BAD)
    problems = " | ".join(image_problems(path))
    for expected in ("not pinned", "runs as 'root'", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "/models"):
        assert expected in problems


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_embedding_model_is_converted_at_build_time(name: str) -> None:
    runs = [i["value"] for i in parse_dockerfile(ROOT / name).structure if i["instruction"] == "RUN"]
    assert any("python model_repo/convert_minilm.py" in run for run in runs)
    assert any("[embedding]" in run for run in runs)
    if name.endswith(".gpu"):
        assert any("[gpu]" in run for run in runs)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_copied_source_exists_and_is_not_docker_ignored(name: str) -> None:
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for item in parse_dockerfile(ROOT / name).structure:
        if item["instruction"] != "COPY" or "--from=" in item["value"]:
            continue
        for source in item["value"].split()[:-1]:
            assert (ROOT / source).exists(), f"{name} copies {source}, which does not exist"
            assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is in .dockerignore"
