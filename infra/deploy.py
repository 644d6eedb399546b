#!/usr/bin/env python3
"""The deploy lifecycle behind `make deploy`, `make deploy-forwarders` and `make destroy`.

One deployment is one samconfig environment (ENV, default `default`): its main stack, in its
region, and a forwarder stack `<stack>-forwarder` in every other allowed region, sending our
AWS events to the main stack's region. Two environments never share a stack name, so their
forwarders never overwrite each other.

The tracked `samconfig.toml` holds no account's values. A guided deploy writes its answers
(parameters, region, stack name) to `samconfig.local.toml`, which git ignores; once it exists
every command reads it instead (SAM reads one config file).

Standard library only (Python 3.11): it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACKED = "samconfig.toml"
LOCAL = "samconfig.local.toml"
TEMPLATE = "infra/template.yaml"
FORWARDER = "infra/region-forwarder.yaml"
# The forwarders' stack name before 0.1.0, whatever the main stack's name.
LEGACY_FORWARDER = "capacity-pilot-forwarder"
DEFAULT_STACK = "capacity-pilot"


def fail(message: str, code: int = 1) -> None:
    print(message, file=sys.stderr)
    sys.exit(code)


class Deployment:
    """One samconfig environment resolved: its file, stack, region and allowed regions."""

    def __init__(self, env: str, config_dir: Path, region: str | None, regions: str | None):
        self.env = env
        self.dir = config_dir
        self.args = (region, regions)
        self.tracked, self.local = config_dir / TRACKED, config_dir / LOCAL
        self.config = self.local if self.local.exists() else self.tracked
        data = tomllib.loads(self.config.read_text()) if self.config.exists() else {}
        section = data.get(env, {})
        params: dict = {}
        for command in ("global", "deploy"):
            params.update(section.get(command, {}).get("parameters", {}))
        self.params = params
        self.stack = params.get("stack_name") or (
            DEFAULT_STACK if env == "default" else f"{DEFAULT_STACK}-{env}"
        )
        self.region = (
            region
            or params.get("region")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
        )
        self.regions = [r.strip() for r in (regions or self.allowed_regions()).split(",") if r.strip()]

    def allowed_regions(self) -> str:
        """The stack's AllowedRegions: its parameter override, else the template's default."""
        overrides = self.params.get("parameter_overrides", "")
        if isinstance(overrides, list):
            overrides = " ".join(overrides)
        for word in shlex.split(overrides):
            key, _, value = word.partition("=")
            if key == "AllowedRegions":
                return value
        return template_default("AllowedRegions")

    def need_stack_name(self) -> str:
        """The stack name, if the template can name its resources after it: the event
        archive is named after the stack alone, and an archive's name has at most 48
        characters of [.-_A-Za-z0-9] (EventBridge's Archive API reference)."""
        if len(self.stack) > 48 or not all(c.isalnum() or c in ".-_" for c in self.stack):
            fail(
                f"stack name {self.stack!r} for ENV={self.env} is {len(self.stack)} characters: "
                f"the stack's event archive is named after it, and an archive name has at most "
                f"48 letters, digits, '.', '-' or '_'; set a shorter `stack_name` under "
                f"[{self.env}.global.parameters] in {self.config.name}"
            )
        return self.stack

    def need_region(self) -> str:
        if not self.region:
            fail(
                f"no region for ENV={self.env} (stack {self.stack}): set `region` under "
                f"[{self.env}.deploy.parameters] in {self.config.name}, or AWS_REGION, "
                f"or pass REGION=<region>"
            )
        return self.region

    def forwarder_regions(self) -> list[str]:
        home = self.need_region()
        return [r for r in self.regions if r != home]

    @property
    def config_file(self) -> str:
        """The config file as SAM is given it: relative to the repository when inside it."""
        return os.path.relpath(self.config)

    @property
    def forwarder_stack(self) -> str:
        return f"{self.stack}-forwarder"


def template_default(parameter: str) -> str:
    """A parameter's Default in the main template (read as text: no YAML parser needed)."""
    text = (ROOT / TEMPLATE).read_text()
    block = re.search(rf"^  {parameter}:\n((?:    .*\n)+)", text, re.M)
    default = block and re.search(r"^    Default:\s*(.+)$", block.group(1), re.M)
    if not default:
        fail(f"{TEMPLATE} has no Default for {parameter}")
    return default.group(1).strip().strip("\"'")


def sam(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    if not shutil.which("sam"):
        fail(
            "this needs the AWS SAM CLI: "
            "https://docs.aws.amazon.com/serverless-application-model/latest/developerguide/install-sam-cli.html"
        )
    done = subprocess.run(["sam", *args], text=True, capture_output=capture)
    if check and done.returncode != 0:
        if capture:
            sys.stderr.write(done.stderr)
        fail(f"`sam {' '.join(args[:1])}` failed (exit {done.returncode}); nothing after it ran")
    return done


def stack_exists(name: str, region: str) -> bool:
    """Whether CloudFormation has `name` in `region` (`sam list resources` fails if not)."""
    done = sam("list", "resources", "--stack-name", name, "--region", region,
               "--output", "json", check=False, capture=True)
    return done.returncode == 0


def confirm_flag(confirm: bool) -> str:
    return "--confirm-changeset" if confirm else "--no-confirm-changeset"


def deploy_forwarders(d: Deployment, confirm: bool) -> None:
    home = d.need_region()
    regions = d.forwarder_regions()
    if not regions:
        print(f"no allowed region other than {home}: nothing to forward")
    for region in regions:
        print(f"forwarder {d.forwarder_stack}: {region} -> {home}")
        # An environment the file does not define: none of the main stack's settings
        # (its parameters above all) reach the forwarder.
        sam("deploy", "--config-file", d.config_file, "--config-env", "forwarder",
            "--template-file", FORWARDER, "--stack-name", d.forwarder_stack,
            "--region", region, "--parameter-overrides", f"HomeRegion={home}",
            "--capabilities", "CAPABILITY_IAM", "--no-fail-on-empty-changeset",
            confirm_flag(confirm))
    report_leftovers(d, regions)


def report_leftovers(d: Deployment, regions: list[str]) -> None:
    """A forwarder named as before 0.1.0 keeps forwarding; say where and how to delete it."""
    if d.forwarder_stack == LEGACY_FORWARDER:
        return  # it is this deployment's own forwarder, just updated
    for region in regions:
        if stack_exists(LEGACY_FORWARDER, region):
            print(
                f"leftover: stack {LEGACY_FORWARDER} in {region} is a forwarder deployed before "
                f"0.1.0 (forwarders are now named <stack>-forwarder). If no deployment whose "
                f"stack is named {DEFAULT_STACK} uses it, delete it:\n"
                f"  sam delete --stack-name {LEGACY_FORWARDER} --region {region}"
            )


def deploy(d: Deployment, guided: bool, confirm: bool) -> None:
    d.need_stack_name()
    args = ["deploy", "--config-env", d.env, "--stack-name", d.stack]
    if guided:
        if not d.local.exists():
            shutil.copyfile(d.tracked, d.local)
        d.config = d.local
        args += ["--guided"]
    elif not d.region:
        d.need_region()
    if d.region:
        args += ["--region", d.region]
    sam(*args[:1], "--config-file", d.config_file, *args[1:])
    if guided:
        # The answers (the region above all) are in the local file now.
        d = Deployment(d.env, d.dir, *d.args)
        print(f"your answers are in {d.config_file} (git ignores it); later deploys read it")
    print(f"stack {d.stack} deployed in {d.need_region()}")
    deploy_forwarders(d, confirm)


def live_requests(d: Deployment, cli: str) -> list[dict]:
    cmd = shlex.split(cli) + ["list", "--live", "--stack", d.stack, "--region", d.need_region(),
                              "--output", "json"]
    done = subprocess.run(cmd, text=True, capture_output=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        fail(f"could not list {d.stack}'s live requests (exit {done.returncode}), so nothing was "
             f"deleted; fix the error above, or check the stack name and region (ENV={d.env})",
             done.returncode)
    return json.loads(done.stdout or "[]")


def destroy(d: Deployment, cli: str, confirm: bool) -> None:
    region = d.need_region()
    live = live_requests(d, cli)
    if live:
        lines = "\n".join(f"  {r['request_id']}  {r['status']}" for r in live)
        fail(
            f"{len(live)} request(s) of {d.stack} are live; nothing was deleted:\n{lines}\n"
            f"Deleting the stack now would leave their paid windows unwatched and their instances "
            f"running. Cancel each (capacity-pilot cancel <id>, with --stop-running to stop paid "
            f"windows too) or wait until `capacity-pilot list --live` shows none, then run this "
            f"again."
        )
    outputs = sam("list", "stack-outputs", "--stack-name", d.stack, "--region", region,
                  "--output", "json", capture=True)
    table = next((o["OutputValue"] for o in json.loads(outputs.stdout or "[]")
                  if o.get("OutputKey") == "StateTableName"), None)
    prompts = [] if confirm else ["--no-prompts"]
    for fregion in d.forwarder_regions():
        if stack_exists(d.forwarder_stack, fregion):
            print(f"deleting {d.forwarder_stack} in {fregion}")
            sam("delete", "--stack-name", d.forwarder_stack, "--region", fregion, *prompts)
    print(f"deleting {d.stack} in {region}")
    sam("delete", "--stack-name", d.stack, "--region", region, *prompts)
    report_leftovers(d, d.forwarder_regions())
    kept = table or f"the {d.stack} state table"
    print(
        f"kept: {kept} in {region}, every request's history and the teams' spend "
        f"(DeletionPolicy Retain, deletion protection on). To delete it too:\n"
        f"  aws dynamodb update-table --table-name {kept} --no-deletion-protection-enabled --region {region}\n"
        f"  aws dynamodb delete-table --table-name {kept} --region {region}\n"
        f"kept too: SAM's managed bucket (stack aws-sam-cli-managed-default), which every stack "
        f"deployed with SAM in this account and region shares."
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["check", "deploy", "forwarders", "destroy"])
    p.add_argument("--env", default="default", help="the samconfig environment")
    p.add_argument("--config-dir", type=Path, default=ROOT,
                   help="where samconfig.toml and samconfig.local.toml are (default: the repository)")
    p.add_argument("--region", default=None, help="the main stack's region")
    p.add_argument("--regions", default=None, help="the allowed regions, comma-separated")
    p.add_argument("--guided", action="store_true")
    p.add_argument("--confirm", action="store_true", help="ask before each change")
    p.add_argument("--cli", default="capacity-pilot", help="the capacity-pilot command")
    a = p.parse_args()
    d = Deployment(a.env or "default", a.config_dir, a.region or None, a.regions or None)
    if a.command == "check":
        # Before the long build: the settings a deploy needs resolve.
        d.need_stack_name()
        if not a.guided:
            d.need_region()
        print(f"ENV={d.env}: stack {d.stack} in {d.region or '(asked)'}, config {d.config.name}")
    elif a.command == "deploy":
        deploy(d, a.guided, a.confirm)
    elif a.command == "forwarders":
        deploy_forwarders(d, a.confirm)
    else:
        destroy(d, a.cli, a.confirm)


if __name__ == "__main__":
    main()
