"""cfn-lint, cdk-nag and checkov on every synthesized template, and a real offline `cdk synth`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint_file

from tests.checkov import scan

pytestmark = pytest.mark.slow  # cfn-lint, cdk-nag and checkov over every stack

VARIANTS = ["p5", "p4de", "g5-dev", "p5-capacity-block", "p4de-existing-vpc", "p5-persistent", "p5-spares"]

# Accepted cfn-lint warnings (no errors are accepted):
# - W3005 "dependency already enforced by a Ref/GetAtt": CDK's own constructs (kubectl provider,
#   aws_eks_v2 internals) add DependsOn next to references; harmless redundancy.
# - W3010 "Avoid hardcoding availability zones": deliberate. The profile names the AZ that holds
#   the GPU capacity, and the GPU nodes and FSx must share it.
ACCEPTED_WARNINGS = {"W3005", "W3010"}

CDK_CLI = Path(__file__).resolve().parents[2] / ".cache" / "cdk" / "node_modules" / ".bin" / "cdk"


@pytest.mark.parametrize("variant", VARIANTS)
def test_cfn_lint_has_no_errors(synth, variant):
    s = synth(variant)
    for name in sorted(s.outdir.glob("*.template.json")):
        matches = lint_file(name, config=ManualArgs(regions=[s.profile.region]))
        unexpected = [
            f"{m.rule.id} {m.message} ({m.path_string if hasattr(m, 'path_string') else ''})"
            for m in matches
            if m.rule.id not in ACCEPTED_WARNINGS
        ]
        assert not unexpected, f"{name.name}:\n" + "\n".join(unexpected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cdk_nag_aws_solutions_has_no_unacknowledged_findings(synth, variant):
    # Both validation plugins: cdk-nag's AwsSolutions pack and CDK's built-in template check.
    s = synth(variant)
    assert not s.violations, "\n".join(f"{p}: {rule} at {path}" for p, rule, path in s.violations)


def test_checkov_finds_nothing_in_any_template(synth, variant_names, tmp_path):
    """One checkov process over the templates of every variant (not their Lambda assets)."""
    stacks = set()
    for variant in variant_names:
        s = synth(variant)
        for template in s.outdir.glob("*.template.json"):
            shutil.copy(template, tmp_path / template.name)
            stacks.add(template.name)
    assert len(stacks) == 4 * len(variant_names)  # the profiles' names keep the files apart
    result = scan("cloudformation", tmp_path)
    assert not result.parsing_errors
    assert not result.failed, "checkov findings in the templates:\n" + result.failures()
    scanned = {Path(r["file_path"]).name for r in (*result.passed, *result.skipped)}
    assert scanned == stacks
    assert all(r["check_result"].get("suppress_comment") for r in result.skipped)


def test_cdk_nag_plugin_is_wired_and_reports_findings(tmp_path):
    """The same `add_nag` the app uses fails synthesis on a world-open security group."""
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    from infra.app import add_nag

    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "NagProbe")
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        max_azs=1,
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="p", subnet_type=ec2.SubnetType.PUBLIC)],
    )
    ec2.SecurityGroup(stack, "Open", vpc=vpc).add_ingress_rule(
        ec2.Peer.any_ipv4(), ec2.Port.tcp(22)
    )
    add_nag(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {
        v["ruleName"]
        for p in report["pluginReports"]
        if p["pluginName"] == "AwsSolutions"
        for v in p["violations"]
    }
    assert "AwsSolutions-EC23" in rules


def test_acknowledgements_need_a_reason():
    import aws_cdk as cdk

    from infra.nag import acknowledge

    with pytest.raises(ValueError, match="real reason"):
        acknowledge(cdk.App(), ("AwsSolutions-IAM4", "managed"))


@pytest.mark.skipif(
    not CDK_CLI.exists(),
    reason="cdk CLI not installed: run `npm install --prefix .cache/cdk aws-cdk` (make test does)",
)
def test_cdk_cli_synth_works_offline_without_credentials(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") and k not in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION")
    }
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no instance-profile credentials either
    out = tmp_path / "cdk.out"
    root = CDK_CLI.parents[4]
    result = subprocess.run(
        [str(CDK_CLI), "synth", "--quiet", "-o", str(out), "-c", "profile=p4de"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    names = {p.name for p in out.glob("*.template.json")}
    assert names == {f"nvrx-p4de-{s}.template.json" for s in ("network", "registry", "cluster", "gpu")}
    # cdk.json keeps the CLI quiet on the network: no notices, no telemetry.
    cdk_json = json.loads((root / "cdk.json").read_text())
    assert cdk_json["notices"] is False and cdk_json["context"]["cli-telemetry"] is False
    assert shutil.which("node")


def test_checkov_skips_need_a_reason_and_add_up():
    import aws_cdk as cdk
    from aws_cdk import aws_sqs as sqs

    from infra import checkov

    stack = cdk.Stack(cdk.App(), "SkipProbe")
    queue = sqs.CfnQueue(stack, "Queue")
    with pytest.raises(ValueError, match="real reason"):
        checkov.skip(queue, ("CKV_AWS_27", "fine"))
    first = ("CKV_AWS_27", "A probe queue that exists only to test how skips are recorded.")
    second = ("CKV2_AWS_73", "The same probe queue, skipped a second time by another caller.")
    checkov.skip(queue, first)
    checkov.skip(queue, second)
    metadata = stack.resolve(queue.get_metadata("checkov"))
    assert metadata == {"skip": [{"id": i, "comment": r} for i, r in (first, second)]}
