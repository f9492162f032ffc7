"""Renders the Helm chart and validates what it renders, for tests/it/chart.rs.

    render.py CHART NAME NAMESPACE VALUES_JSON

Helm itself renders (helm-python-sdk: Helm's Go SDK behind a C ABI, no
helm binary), `helm lint --strict` runs on the same values, and every
object is validated against the Kubernetes OpenAPI schemas of the oldest
and the newest version the chart supports (kubernetes-validate, strict:
unknown fields are errors). Kinds without a schema there (the Prometheus
operator's ServiceMonitor) are listed as unvalidated; the Rust test checks
those itself. Prints one JSON object; exits 0 unless the tools fail.
"""

import json
import sys

import helm_python as helm
import kubernetes_validate
import yaml

VERSIONS = ["1.25.0", "1.37.0"]


def main():
    chart_dir, name, namespace, values_json = sys.argv[1:5]
    values = json.loads(values_json)
    out = {"documents": [], "invalid": [], "unvalidated": [], "notes": "", "error": None}
    try:
        rendered = helm.Chart.load(chart_dir).render(
            values=values, name=name, namespace=namespace, is_install=True
        )
    except helm.HelmError as err:
        out["error"] = str(err)
        print(json.dumps(out))
        return
    report = helm.lint(chart_dir, values, strict=True, namespace=namespace)
    out["lint"] = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            out["notes"] = text
            continue
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            out["documents"].append(doc)
            for version in VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.SchemaNotFoundError:
                    if doc["kind"] not in out["unvalidated"]:
                        out["unvalidated"].append(doc["kind"])
                    break
                except kubernetes_validate.ValidationError as err:
                    where = "/".join(str(p) for p in err.path)
                    out["invalid"].append(
                        f"{doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): "
                        f"{where}: {err.message}"
                    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
