"""Checks the Helm chart without helm (it cannot be installed on our machines):

1. values.yaml validates against values.schema.json;
2. every `.Values.…` path a template references exists in values.yaml and in the schema;
3. every template is well-formed YAML once its template actions are stubbed;
4. the Grafana dashboard is valid JSON with queries, and every metric the dashboard and the alert
   rules name is one the binaries export (read from their metric definitions).

Exits non-zero with one line per problem.
"""

import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml

chart = Path(__file__).resolve().parent.parent / "charts" / "gatehouse"
problems: list[str] = []

values = yaml.safe_load((chart / "values.yaml").read_text())
schema = json.loads((chart / "values.schema.json").read_text())
jsonschema.Draft202012Validator.check_schema(schema)
for error in jsonschema.Draft202012Validator(schema).iter_errors(values):
    problems.append(f"values.yaml: {'.'.join(map(str, error.path))}: {error.message}")


def schema_has(node: dict, path: list[str]) -> bool:
    for key in path:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].split("/")[-1]]
        props = node.get("properties", {})
        if key not in props:
            return False
        node = props[key]
    return True


def values_has(path: list[str]) -> bool:
    node = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


templates = sorted(p for p in (chart / "templates").iterdir() if p.suffix in (".yaml", ".tpl"))
checked = 0
for template in templates:
    text = template.read_text()
    for ref in sorted(set(re.findall(r"\.Values((?:\.[A-Za-z0-9_]+)+)", text))):
        path = ref.strip(".").split(".")
        checked += 1
        if not values_has(path):
            problems.append(f"{template.name}: .Values{ref} is not in values.yaml")
        if not schema_has(schema, path):
            problems.append(f"{template.name}: .Values{ref} is not in values.schema.json")
    if template.suffix != ".yaml":
        continue
    stubbed = []
    for line in text.splitlines():
        stripped = line.strip()
        block = re.fullmatch(r"\{\{-?\s*(if|else|end|range|with|define)\b.*\}\}", stripped)
        if block:
            continue
        nindent = re.fullmatch(r"\{\{-?\s*(include|toYaml)\b.*\|\s*nindent\s+(\d+)\s*\}\}", stripped)
        if nindent:
            stubbed.append(" " * int(nindent.group(2)) + "stub: value")
            continue
        stubbed.append(re.sub(r"\{\{-?.*?-?\}\}", "stub", line))
    try:
        documents = [d for d in yaml.safe_load_all("\n".join(stubbed)) if d is not None]
        for d in documents:
            if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
                problems.append(f"{template.name}: a document without kind/apiVersion")
    except yaml.YAMLError as e:
        problems.append(f"{template.name}: not well-formed YAML once stubbed: {e}")

# The metrics the binaries export: names from their definitions, with their registry prefix.
repo = chart.parent.parent
exported: set[str] = set()
for source, prefix in [
    (repo / "worker" / "src" / "metrics.rs", "gatehouse_worker_"),
    (repo / "control-plane" / "src" / "lib.rs", "gatehouse_control_plane_"),
]:
    for name in re.findall(r'(?:Opts|HistogramOpts|IntGauge|Gauge|IntCounter)::new\(\s*"([a-z_]+)"', source.read_text()):
        exported.add(prefix + name)
if not exported:
    problems.append("no metric definitions found in the worker or control plane")


def metric_names(text: str) -> set[str]:
    names = set(re.findall(r"\bgatehouse_[a-z_]+", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


dashboard_path = chart / "dashboards" / "gatehouse.json"
try:
    dashboard = json.loads(dashboard_path.read_text())
    queries = [t.get("expr", "") for p in dashboard.get("panels", []) for t in p.get("targets", [])]
    if not queries or not all(queries):
        problems.append("dashboards/gatehouse.json: every panel needs queries")
    for name in sorted(metric_names(" ".join(queries)) - exported):
        problems.append(f"dashboards/gatehouse.json: {name} is not a metric the binaries export")
except (OSError, json.JSONDecodeError) as e:
    problems.append(f"dashboards/gatehouse.json: {e}")
rules = (chart / "templates" / "monitoring.yaml").read_text()
if "alert:" not in rules:
    problems.append("templates/monitoring.yaml: no alert rules")
for name in sorted(metric_names(rules) - exported):
    problems.append(f"templates/monitoring.yaml: {name} is not a metric the binaries export")

if checked == 0:
    problems.append("no .Values references found: the check saw no templates")
for p in problems:
    print(p)
print(f"chart check: {len(templates)} templates, {checked} value references, {len(problems)} problems")
sys.exit(1 if problems else 0)
