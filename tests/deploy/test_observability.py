"""The compose stack's Prometheus configuration and Grafana dashboard, checked with promtool
(Prometheus' own parser) against ferry's metric names."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from tests.deploy.commands import parse_ferry
from tests.deploy.manifests import ROOT, as_argv, compose_model, tool

PROMETHEUS = ROOT / "deploy/prometheus/prometheus.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/ferry.json"
DATASOURCE = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
PROVIDER = ROOT / "deploy/grafana/provisioning/dashboards/ferry.yml"

# The metric names ferry's gateway and workers export (issue 7), histograms by their base name.
COUNTERS = {"ferry_inference_request_success_total", "ferry_inference_request_failure_total",
            "ferry_inference_count_total", "ferry_inference_exec_count_total", "ferry_http_requests_total"}
HISTOGRAMS = {"ferry_inference_request_duration_seconds", "ferry_inference_queue_duration_seconds",
              "ferry_inference_compute_duration_seconds", "ferry_inference_batch_size",
              "ferry_http_request_duration_seconds"}
GAUGES = {"ferry_inference_pending_request_count", "ferry_queue_lag", "ferry_queue_pending", "ferry_queue_depth",
          "ferry_worker_up", "ferry_workers_live", "ferry_worker_info"}
SERIES = COUNTERS | GAUGES | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
# Grafana's variables, replaced by values Prometheus would accept before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$model": ".*"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool", "make system-packages"), *args], capture_output=True, text=True, timeout=60)


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def rules_file(exprs: list[str], path: Path) -> Path:
    """The expressions as recording rules, so `promtool check rules` parses each one."""
    for name, value in GRAFANA_VARIABLES.items():
        exprs = [expr.replace(name, value) for expr in exprs]
    rules = [{"record": f"ferry:dashboard:{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def test_prometheus_config_is_valid() -> None:
    result = promtool("check", "config", "--syntax-only", str(PROMETHEUS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    config["scrape_configs"][0]["dns_sd_configs"][0]["type"] = "AAAAA"
    config["global"]["scrape_interval"] = "5 seconds"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    assert promtool("check", "config", "--syntax-only", str(path)).returncode != 0


def test_prometheus_scrapes_the_gateway_and_every_worker_on_ferrys_ports() -> None:
    services = compose_model(ROOT / "compose.yaml", "gpu")["services"]
    jobs = {job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    targets = {(name, sd["port"]) for job in jobs.values() for sd in job["dns_sd_configs"] for name in sd["names"]}
    assert targets == {("gateway", 8000), ("worker", 8002), ("worker-gpu", 8002)}
    for name, port in targets:
        args = parse_ferry(as_argv(services[name]["command"]), f"compose service {name}")
        listens = args.http_port if args.command == "gateway" else args.metrics_port
        assert listens == port, f"Prometheus scrapes {name}:{port}, ferry listens on {listens}"
    assert all(job["metrics_path"] == "/metrics" for job in jobs.values())


def test_every_dashboard_query_parses_and_uses_ferrys_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    found = expressions(dashboard)
    assert len(found) >= 10
    result = promtool("check", "rules", str(rules_file([expr for _, expr in found], tmp_path / "rules.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    used = set()
    for title, expr in found:
        names = set(re.findall(r"\b(ferry_[a-z_]+)", expr))
        assert names and names <= SERIES, f"{title!r} queries {names - SERIES or 'no ferry metric'}"
        used |= names
    # What the issue asks the dashboard to show.
    for needed in ("ferry_inference_request_success_total", "ferry_inference_request_failure_total",
                   "ferry_inference_request_duration_seconds_bucket", "ferry_inference_queue_duration_seconds_bucket",
                   "ferry_inference_compute_duration_seconds_bucket", "ferry_inference_batch_size_bucket",
                   "ferry_inference_pending_request_count", "ferry_queue_lag", "ferry_queue_pending",
                   "ferry_workers_live"):
        assert needed in used, f"the dashboard shows no {needed}"
    assert any("histogram_quantile(0.99" in expr for _, expr in found)
    assert any("by (model, reason)" in expr for _, expr in found)


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    result = promtool("check", "rules", str(rules_file(["sum by (model (rate(ferry_queue_lag[1m]))"], tmp_path / "r.yml")))
    assert result.returncode != 0


def test_grafana_provisions_the_datasource_the_dashboard_uses() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    source = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel}
    assert uids == {source["uid"]}
    provider = yaml.safe_load(PROVIDER.read_text())["providers"][0]
    grafana = compose_model(ROOT / "compose.yaml")["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts[str(DASHBOARD.parent)] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
