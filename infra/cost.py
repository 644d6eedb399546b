#!/usr/bin/env python3
"""What capacity-pilot costs a month (`make cost`), by the published prices of infra/costs.toml.

Two figures, for a month of 730 hours:

- idle: nothing requested, every schedule of infra/template.yaml still firing. Each scheduled
  tick is priced as the quietest scheduled invocations of its function in make run's log
  (invocations.jsonl) ran: of the function's scheduled invocations that decided and published
  nothing (all of them if none is that quiet), those with the fewest AWS calls; of these, the
  one of median duration (the lower median), with its DynamoDB calls. A function with no
  scheduled invocation in the log, or every function when no log is given, takes
  costs.toml's [idle_tick]. Plus every fixed monthly cost: alarms, custom metrics, KMS keys,
  the table's storage and backups, and the log storage the ticks' logs keep.
- at make run's load: the log's invocations over its simulated span (first to last `at`),
  scaled to a month, plus the ticks of every schedule the log does not hold (the local runner
  fires a schedule only when its function has work: the others are idle ticks, as above), plus
  the fixed costs.

Lambda compute is each invocation's duration rounded up to 1 ms, times MemorySize / 1024 GB,
at the arm64 GB-second price. Each event published is written to the event log (when a rule of
the template targets a log group) and taken by the bus's archive (when the template has one),
at [estimate] event_bytes each, and kept for their retention. The log counts AWS calls per service without telling DynamoDB's
reads from its writes, so each DynamoDB call is priced as one write request unit (the harsher
reading). Each event published is one PutEvents entry; each delivery of an AWS event that a
forwarder's rule matches is priced as sent from another region (the harsher reading: some
happen in the home region); each failed invocation as one message to a dead-letter queue and
one alarm notice (an SNS publish and its KMS request).

Exits 1 with a message when a file is missing, or when a resource type of either template has
no row in costs.toml (priced or free).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SCHEDULED = "Scheduled Event"
GIB = 1024**3
WIDTH = 100


class Failure(Exception):
    """What stops the estimate: printed, exit 1."""


# --- templates ----------------------------------------------------------------------------


class TemplateLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags: `!Ref x` reads as {"Ref": x}, `!Sub s` as
    {"Fn::Sub": s}, and so on for any `!` tag."""


def _short_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


TemplateLoader.add_multi_constructor("!", _short_tag)


@dataclass
class Template:
    path: Path
    doc: dict

    def resources(self):
        """(logical id, resource, copies) of every resource; a `Fn::ForEach` loop's resources
        count once per element of a literal collection."""

        def walk(mapping: dict, copies: int):
            for key, value in mapping.items():
                if key.startswith("Fn::ForEach::"):
                    if not (
                        isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict)
                    ):
                        raise Failure(
                            f"{self.path}: {key} is not [identifier, collection, template]"
                        )
                    n = len(value[1]) if isinstance(value[1], list) else 1
                    yield from walk(value[2], copies * n)
                elif isinstance(value, dict):
                    yield key, value, copies

        return list(walk(self.doc["Resources"], 1))

    def of_type(self, kind: str):
        return [
            (lid, r.get("Properties") or {}, n)
            for lid, r, n in self.resources()
            if r.get("Type") == kind
        ]

    def resolve(self, value):
        """A `Ref` to a parameter: its default."""
        if isinstance(value, dict) and set(value) == {"Ref"}:
            param = (self.doc.get("Parameters") or {}).get(value["Ref"]) or {}
            if "Default" in param:
                return param["Default"]
        return value


def load_template(path: Path) -> Template:
    if not path.is_file():
        raise Failure(f"{path}: no such template")
    with path.open() as f:
        doc = yaml.load(f, Loader=TemplateLoader)  # a SafeLoader, with the short tags
    if not isinstance(doc, dict) or not isinstance(doc.get("Resources"), dict):
        raise Failure(f"{path}: not a template (no Resources)")
    return Template(path, doc)


RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")


def rate_minutes(expression, where: str) -> float:
    m = RATE.match(str(expression).strip())
    if not m:
        raise Failure(
            f"{where}: schedule {expression!r} is not rate(N minutes|hours|days); "
            "cost.py counts no cron"
        )
    n, unit = int(m.group(1)), m.group(2)
    return n * {"m": 1, "h": 60, "d": 1440}[unit[0]]


@dataclass
class Function:
    name: str
    memory_mb: int
    arch: str
    # minutes between ticks, one per Schedule event
    schedules: list[float] = field(default_factory=list)

    def ticks_a_month(self, hours: float) -> float:
        return sum(hours * 60 / every for every in self.schedules)


def functions(t: Template) -> dict[str, Function]:
    """The template's functions by binary name (the last part of CodeUri, as make run's log
    names them), with their MemorySize, architecture and schedules (Globals merged)."""
    globals_ = (t.doc.get("Globals") or {}).get("Function") or {}
    out = {}
    for lid, p, _ in t.of_type("AWS::Serverless::Function"):
        code = p.get("CodeUri")
        name = code.rstrip("/").rsplit("/", 1)[-1] if isinstance(code, str) else lid
        memory = t.resolve(p.get("MemorySize", globals_.get("MemorySize", 128)))
        arch = (p.get("Architectures") or globals_.get("Architectures") or ["x86_64"])[0]
        schedules = []
        for ev_name, ev in (p.get("Events") or {}).items():
            props = ev.get("Properties") or {}
            if ev.get("Type") != "Schedule":
                continue
            if props.get("Enabled") is False or props.get("State") == "DISABLED":
                continue
            where = f"{t.path}: {lid}.Events.{ev_name}"
            schedules.append(rate_minutes(props.get("Schedule"), where))
        if not str(memory).isdigit():
            raise Failure(f"{t.path}: {lid}: MemorySize {memory!r} is not a number of MB")
        out[name] = Function(name, int(memory), str(arch), schedules)
    return out


def days_kept(value) -> int:
    """A retention in days; none (or 0, "for ever") is priced as a year's."""
    return int(value) if str(value).isdigit() and int(value) > 0 else 365


def event_log_days(t: Template) -> int | None:
    """The retention of the log group a rule of the template writes events to (the event log),
    or None when no rule targets a log group."""
    groups = {lid: p for lid, p, _ in t.of_type("AWS::Logs::LogGroup")}
    for _, p, _ in t.of_type("AWS::Events::Rule"):
        for target in p.get("Targets") or []:
            arn = target.get("Arn")
            got = arn.get("Fn::GetAtt") if isinstance(arn, dict) else None
            lid = (got[0] if isinstance(got, list) else str(got).split(".")[0]) if got else None
            if lid in groups:
                return days_kept(t.resolve(groups[lid].get("RetentionInDays")))
    return None


def archive_days(t: Template) -> int | None:
    """The retention of the template's event archive, or None when it has none."""
    archives = t.of_type("AWS::Events::Archive")
    if not archives:
        return None
    return max(days_kept(t.resolve(p.get("RetentionDays"))) for _, p, _ in archives)


def forwarded_detail_types(t: Template) -> set[str]:
    """The detail-types the forwarder's rules send to the home region."""
    out = set()
    for _, p, _ in t.of_type("AWS::Events::Rule"):
        pattern = p.get("EventPattern") or {}
        if isinstance(pattern, str):
            pattern = json.loads(pattern)
        out.update(pattern.get("detail-type") or [])
    return out


# --- prices -------------------------------------------------------------------------------


@dataclass
class Costs:
    path: Path
    doc: dict

    def unit(self, key: str) -> float:
        """The price of one unit of price row `key`."""
        row = self.doc["price"].get(key)
        if row is None:
            raise Failure(f"{self.path}: no price row [price.{key}]")
        return row["usd"] / row["per"]


def load_costs(path: Path) -> Costs:
    if not path.is_file():
        raise Failure(f"{path}: no such price file")
    with path.open("rb") as f:
        try:
            doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise Failure(f"{path}: {e}") from e
    for key in ("as_of", "hours_per_month", "price", "type", "estimate", "idle_tick"):
        if key not in doc:
            raise Failure(f"{path}: no `{key}`")
    for key, row in doc["price"].items():
        for need in ("usd", "per", "unit", "source"):
            if need not in row:
                raise Failure(f"{path}: [price.{key}] has no `{need}`")
    for kind, row in doc["type"].items():
        if bool(row.get("prices")) == bool(row.get("free")):
            raise Failure(f'{path}: [type."{kind}"] needs either `prices` or `free` (the reason)')
        for key in row.get("prices") or []:
            if key not in doc["price"]:
                raise Failure(f'{path}: [type."{kind}"] names [price.{key}], which it lacks')
    return Costs(path, doc)


def check_types(costs: Costs, templates: list[Template]) -> None:
    """Every resource type of the templates, and every event source type of their functions,
    has a row in costs.toml."""
    missing: dict[str, list[str]] = {}
    for t in templates:
        for lid, r, _ in t.resources():
            kinds = [(r.get("Type"), lid)]
            if r.get("Type") == "AWS::Serverless::Function":
                for ev_name, ev in ((r.get("Properties") or {}).get("Events") or {}).items():
                    kinds.append((ev.get("Type"), f"{lid}.Events.{ev_name}"))
            for kind, where in kinds:
                if kind not in costs.doc["type"]:
                    missing.setdefault(str(kind), []).append(f"{t.path.name}: {where}")
    if missing:
        lines = [
            f"{kind} ({', '.join(where)}) has no row in {shown(costs.path)}: add "
            f'[type."{kind}"] with `prices` (its [price.*] rows) or `free` (why nothing bills it)'
            for kind, where in sorted(missing.items())
        ]
        raise Failure("\n".join(lines))


# --- make run's log -----------------------------------------------------------------------


@dataclass
class Invocation:
    at: datetime
    function: str
    trigger: str
    ok: bool
    duration_ms: float
    calls: dict[str, int]
    published: list
    decisions: list

    @property
    def dynamodb(self) -> int:
        return int(self.calls.get("dynamodb", 0))

    @property
    def all_calls(self) -> int:
        return sum(int(n) for n in self.calls.values())


def load_invocations(path: Path) -> list[Invocation]:
    if not path.is_file():
        raise Failure(
            f"{path}: no such file: run `make run` first (it writes invocations.jsonl), "
            "or name another run's with INVOCATIONS=<file>"
        )
    out = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                out.append(
                    Invocation(
                        at=datetime.fromisoformat(o["at"]),
                        function=o["function"],
                        trigger=o["trigger"],
                        ok=bool(o["ok"]),
                        duration_ms=float(o["duration_ms"]),
                        calls=o.get("aws_calls") or {},
                        published=o.get("published") or [],
                        decisions=o.get("decisions") or [],
                    )
                )
            except (ValueError, KeyError, TypeError) as e:
                raise Failure(
                    f"{path}:{n}: not an invocation of make run's log ({type(e).__name__}: {e})"
                ) from e
    if not out:
        raise Failure(f"{path}: no invocation in it: run `make run` first")
    return out


@dataclass
class Tick:
    duration_ms: float
    dynamodb: int
    measured: bool


def idle_tick(name: str, invocations: list[Invocation], costs: Costs) -> Tick:
    scheduled = [i for i in invocations if i.function == name and i.trigger == SCHEDULED]
    if not scheduled:
        d = costs.doc["idle_tick"]
        return Tick(float(d["duration_ms"]), int(d["dynamodb_calls"]), False)
    quiet = [i for i in scheduled if i.ok and not i.published and not i.decisions] or scheduled
    fewest = min(i.all_calls for i in quiet)
    pool = sorted((i for i in quiet if i.all_calls == fewest), key=lambda i: i.duration_ms)
    pick = pool[(len(pool) - 1) // 2]
    return Tick(pick.duration_ms, pick.dynamodb, True)


# --- the model ----------------------------------------------------------------------------


def gb_seconds(duration_ms: float, memory_mb: int) -> float:
    return math.ceil(duration_ms) / 1000 * memory_mb / 1024


@dataclass
class Usage:
    """A month's billed quantities."""

    requests: float = 0.0
    gb_seconds: float = 0.0
    dynamodb: float = 0.0
    events: float = 0.0
    cross_region: float = 0.0
    failures: float = 0.0
    notices: float = 0.0


@dataclass
class Fixed:
    """The monthly costs that do not depend on the load: (label, dollars)."""

    rows: list[tuple[str, float]]
    retention_days: int
    # How long the event log and the archive keep an event (None: the template has none).
    event_log_days: int | None = None
    archive_days: int | None = None


def fixed_costs(costs: Costs, main: Template, forwarder: Template) -> Fixed:
    def of_both(kind: str):
        return main.of_type(kind) + forwarder.of_type(kind)

    alarms = of_both("AWS::CloudWatch::Alarm")
    high_res = sum(n for _, p, n in alarms if float(main.resolve(p.get("Period", 300))) < 60)
    standard = sum(n for _, _, n in alarms) - high_res
    # A metric filter with a DefaultValue publishes its metric whenever its group gets logs (a
    # function's every tick; the event log's whenever an event is published, counted all month
    # too, the harsher reading): a custom metric all month. Without one, only when it matches:
    # not counted. A namespace may be a Fn::Sub (the stack's own): compared as written.
    metrics = {
        (json.dumps(m.get("MetricNamespace"), sort_keys=True), m.get("MetricName"))
        for _, p, _ in of_both("AWS::Logs::MetricFilter")
        for m in p.get("MetricTransformations") or []
        if "DefaultValue" in m
    }
    keys = sum(n for _, _, n in of_both("AWS::KMS::Key"))
    tables = of_both("AWS::DynamoDB::Table")
    table_gb = float(costs.doc["estimate"]["table_gb"])
    with_pitr = sum(
        n
        for _, p, n in tables
        if (p.get("PointInTimeRecoverySpecification") or {}).get("PointInTimeRecoveryEnabled")
    )
    storage = sum(n for _, _, n in tables) * table_gb * costs.unit("dynamodb_storage")
    backups = with_pitr * table_gb * costs.unit("dynamodb_pitr")

    # The longest retention of the log groups; a group without one keeps its logs for ever,
    # priced as a year's.
    days = [main.resolve(p.get("RetentionInDays")) for _, p, _ in of_both("AWS::Logs::LogGroup")]
    retention = max([int(d) if str(d).isdigit() else 365 for d in days] or [365])

    high = f", {high_res} high-res" if high_res else ""
    return Fixed(
        [
            (
                f"cloudwatch alarms ({standard}{high})",
                standard * costs.unit("cloudwatch_alarm_standard")
                + high_res * costs.unit("cloudwatch_alarm_high_resolution"),
            ),
            (
                f"cloudwatch custom metrics ({len(metrics)})",
                len(metrics) * costs.unit("cloudwatch_custom_metric"),
            ),
            (f"kms keys ({keys}, first year)", keys * costs.unit("kms_key")),
            (f"dynamodb storage + PITR ({len(tables)} x {table_gb:g} GB)", storage + backups),
        ],
        retention,
        event_log_days(main),
        archive_days(main),
    )


def priced(u: Usage, costs: Costs, fixed: Fixed) -> list[tuple[str, float]]:
    """A month's usage in dollars, a row per resource."""
    hours = float(costs.doc["hours_per_month"])
    log_bytes = float(costs.doc["estimate"]["log_bytes_per_invocation"])
    ingested_gb = u.requests * log_bytes / GIB
    retention_days = fixed.retention_days
    kept_months = retention_days / (hours / 24)
    price = costs.unit
    # Each event of ours, whole, in the event log and in the archive, kept their retention.
    events_gb = u.events * float(costs.doc["estimate"]["event_bytes"]) / GIB
    log_days, kept_days = fixed.event_log_days or 0, fixed.archive_days or 0
    event_log = events_gb * (
        price("logs_ingestion") + log_days / (hours / 24) * price("logs_storage")
    )
    archive = events_gb * (
        price("eventbridge_archive_processing")
        + kept_days / (hours / 24) * price("eventbridge_archive_storage")
    )
    # One alarm notice per failure: an SNS publish and its KMS request (no data key caching).
    notice = price("sns_publish") + price("kms_request")
    # Each notice to people: a publish, its KMS request, and an email to the one address
    # NotificationEmail subscribes (teams' own subscriptions are billed the same way, each).
    told = notice + price("sns_email_delivery")
    return [
        ("lambda requests", u.requests * price("lambda_request")),
        ("lambda compute, arm64", u.gb_seconds * price("lambda_arm64_gb_second")),
        ("dynamodb calls, each as a WRU", u.dynamodb * price("dynamodb_write_request_unit")),
        ("eventbridge events published", u.events * price("eventbridge_custom_event")),
        (
            "eventbridge cross-region (forwarders)",
            u.cross_region * price("eventbridge_cross_region_event"),
        ),
        ("sqs dead letters", u.failures * price("sqs_request")),
        ("sns alarm notices + kms requests", u.failures * notice),
        ("sns notices to people + kms + one email each", u.notices * told),
        ("logs ingestion", ingested_gb * price("logs_ingestion")),
        (
            f"logs storage ({retention_days} days kept)",
            ingested_gb * kept_months * price("logs_storage"),
        ),
        (f"event log ({log_days} days kept)", event_log if fixed.event_log_days else 0.0),
        (f"event archive ({kept_days} days kept)", archive if fixed.archive_days else 0.0),
    ]


def wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def money(dollars: float) -> str:
    return f"${dollars:.4f}"


def estimate(args) -> list[str]:
    costs = load_costs(args.costs)
    main, forwarder = load_template(args.template), load_template(args.forwarder)
    check_types(costs, [main, forwarder])
    invocations = load_invocations(args.invocations) if args.invocations else []

    hours = float(costs.doc["hours_per_month"])
    fns = functions(main)
    for f in fns.values():
        if f"lambda_{f.arch}_gb_second" not in costs.doc["price"]:
            raise Failure(
                f"{f.name} runs on {f.arch}: {costs.path} has no [price.lambda_{f.arch}_gb_second]"
            )
    for i in invocations:
        if i.function not in fns:
            raise Failure(f"{args.invocations}: function {i.function} is not in {main.path}")
    ticks = {name: idle_tick(name, invocations, costs) for name in fns}
    forwarded = forwarded_detail_types(forwarder)

    def add_ticks(usage: Usage, name: str, n: float) -> None:
        f, tick = fns[name], ticks[name]
        usage.requests += n
        usage.gb_seconds += n * gb_seconds(tick.duration_ms, f.memory_mb)
        usage.dynamodb += n * tick.dynamodb

    idle = Usage()
    for name, f in fns.items():
        add_ticks(idle, name, f.ticks_a_month(hours))

    load = None
    if invocations:
        first, last = min(i.at for i in invocations), max(i.at for i in invocations)
        span_h = (last - first).total_seconds() / 3600
        if span_h <= 0:
            raise Failure(
                f"{args.invocations}: every invocation is at {first.isoformat()}: "
                "no span to scale to a month"
            )
        scale = hours / span_h
        load = Usage()
        for i in invocations:
            load.requests += scale
            load.gb_seconds += scale * gb_seconds(i.duration_ms, fns[i.function].memory_mb)
            load.dynamodb += scale * i.dynamodb
            load.events += scale * len(i.published)
            load.cross_region += scale * (i.trigger in forwarded)
            load.failures += scale * (not i.ok)
            load.notices += scale * int(i.calls.get("sns", 0))
        # The ticks the runner skipped (nothing due) still fire in AWS: idle ticks.
        for name, f in fns.items():
            logged = sum(1 for i in invocations if i.function == name and i.trigger == SCHEDULED)
            add_ticks(load, name, max(0.0, f.ticks_a_month(hours) - logged * scale))

    fixed = fixed_costs(costs, main, forwarder)
    fixed_total = sum(c for _, c in fixed.rows)
    idle_rows = priced(idle, costs, fixed)
    load_rows = priced(load, costs, fixed) if load is not None else None

    region = costs.doc.get("region", "?")
    out = [
        f"prices of {costs.doc['as_of']} ({region}) from {shown(args.costs)}; "
        "no free tier applied"
    ]
    out.append(f"idle: ${sum(c for _, c in idle_rows) + fixed_total:.2f} a month")
    if load_rows is not None:
        out.append(
            f"at make run's load: ${sum(c for _, c in load_rows) + fixed_total:.2f} a month "
            f"({len(invocations)} invocations over {span_h:.1f} simulated hours, "
            f"scaled to {hours:g} h)"
        )
    else:
        out.append("at make run's load: not estimated, no invocations file given (see make run)")
    out.append(f"  {'a month':44}{'idle':>12}{'at load':>12}")
    for n, (label, cost) in enumerate(idle_rows):
        at_load = money(load_rows[n][1]) if load_rows else "-"
        out.append(f"  {label:44}{money(cost):>12}{at_load:>12}")
    for label, cost in fixed.rows:
        out.append(f"  {label:44}{money(cost):>12}{money(cost) if load_rows else '-':>12}")

    free = sorted(k for k, row in costs.doc["type"].items() if row.get("free"))
    out += wrapped(f"free: {', '.join(free)} (reasons in {args.costs.name})")
    tick_text = ", ".join(
        f"{name} {t.duration_ms:.1f}/{t.dynamodb}{'' if t.measured else '*'}"
        for name, t in ticks.items()
    )
    out += wrapped(
        f"idle tick (ms/DynamoDB calls; *: costs.toml's [idle_tick], none in the log): {tick_text}"
    )
    wru = costs.unit("dynamodb_write_request_unit") * 1e6
    est = costs.doc["estimate"]
    out += wrapped(
        "assumptions: the log does not tell DynamoDB reads from writes, so each call is one write "
        f"request unit (${wru:g}/M, the harsher price; items over 1 KB, transactions and index "
        f"writes cost more); {est['log_bytes_per_invocation']:g} log bytes an invocation, "
        f"{est['event_bytes']:g} bytes an event and a {est['table_gb']:g} GB table are "
        "estimates ([estimate]); not priced: cold-start init, the requesters' own PutEvents, "
        "inter-region data transfer, Logs Insights queries."
    )
    return out


def shown(path: Path) -> str:
    """A path as the reader would type it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--invocations", type=Path, help="make run's invocations.jsonl (omitted: idle figure only)"
    )
    ap.add_argument("--costs", type=Path, default=ROOT / "infra/costs.toml")
    ap.add_argument("--template", type=Path, default=ROOT / "infra/template.yaml")
    ap.add_argument("--forwarder", type=Path, default=ROOT / "infra/region-forwarder.yaml")
    args = ap.parse_args(argv)
    try:
        print("\n".join(estimate(args)))
    except Failure as e:
        print(f"cost: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
