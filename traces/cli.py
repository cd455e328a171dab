"""``simctl trace ...``: import, synthesise, record and inspect moe-trace files."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from moesim.sim.core.atomic import atomic_file, check_target
from moesim.sim.core.errors import MoesimError
from moesim.traces.tracer.record import record

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
# `record` needs the optional torch extra; the command imports it only when it runs
app.command("record", help="Record a moe-trace file from a Hugging Face MoE model (extra: tracer).")(record)


def _console() -> Console:
    # bound at call time, so output goes to the current sys.stdout (tests capture it)
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=False, width=160)
    return console


def _parse_sets(items: list[str] | None, option: str = "--set") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise MoesimError(f"{option} {item!r}: expected KEY=VALUE")
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            out[key] = raw
    return out


@app.command("import")
def import_cmd(
    src: Annotated[Path, typer.Argument(help="source file (routing.csv, .csv, .jsonl, .npy or .json)")],
    out: Annotated[Path, typer.Option("-o", "--out", help="output moe-trace Parquet file")],
    fmt: Annotated[str, typer.Option(
        "--from", help="source format: flame, csv, jsonl, vllm, sglang or llamacpp")],
    model: Annotated[str | None, typer.Option(
        "--model", help="catalog model giving the shape (default for flame: flame-moe-290m); "
        "a name outside the catalog needs --num-layers, --num-experts and --top-k")] = None,
    num_layers: Annotated[int | None, typer.Option(help="override the number of MoE layers")] = None,
    num_experts: Annotated[int | None, typer.Option(help="override the routed experts per layer")] = None,
    top_k: Annotated[int | None, typer.Option(help="override the experts selected per token")] = None,
    column_map: Annotated[str | None, typer.Option(
        "--map", help="csv/jsonl: FIELD=COLUMN,... to read a field from another column name "
        "(e.g. experts=topk_ids,weights=topk_weights,token_idx=pos)")] = None,
    drop_incomplete: Annotated[bool, typer.Option(
        "--drop-incomplete", help="csv/jsonl: drop tokens that miss layers (and renumber the rest) "
        "instead of failing")] = False,
    weights: Annotated[str, typer.Option(
        "--weights", help="csv/jsonl: what the weights are: auto, softmax (over all experts), "
        "renormalized (top-k, sum 1) or scores; recorded in the trace metadata")] = "auto",
    sidecar: Annotated[Path | None, typer.Option(
        help='vllm .npy: JSON {"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]} '
        "(default: SRC with suffix .json)")] = None,
    request_lengths: Annotated[str | None, typer.Option(
        help="vllm .npy, llamacpp: request boundaries as PROMPT:DECODE,PROMPT:DECODE,...")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing output file")] = False,
) -> None:
    """Convert a router log into a moe-trace v1 file (see README, "Importing router logs")."""
    from moesim.traces.importers.registry import (
        FLAME_MODEL,
        FORMATS,
        import_trace,
        model_info,
        parse_request_lengths,
    )

    if fmt not in FORMATS:
        raise MoesimError(f"--from {fmt!r}: unknown format (expected one of {', '.join(FORMATS)})")
    name = model or (FLAME_MODEL if fmt == "flame" else None)
    if name is None:
        raise MoesimError(f"--model is required with --from {fmt}: a catalog name (simctl models), or a name "
                          "of your own with --num-layers, --num-experts and --top-k")
    info = model_info(name, num_layers=num_layers, num_experts=num_experts, top_k=top_k)
    lengths = parse_request_lengths(request_lengths) if request_lengths else None
    check_target(out, option="-o", folder=False, force=force)
    t0 = time.perf_counter()
    path, meta, rows = import_trace(fmt, src, out, model=info, sidecar=sidecar, request_lengths=lengths,
                                    column_map=column_map, drop_incomplete=drop_incomplete, weights=weights)
    m = meta.model
    extra = ""
    if meta.source.get("dropped_tokens"):
        extra += f"; dropped {meta.source['dropped_tokens']} incomplete token(s)"
    if "weights" in meta.source:
        extra += f"; weights: {meta.source['weights']}"
    _console().print(f"wrote {path}: {rows:,} rows, {m.name} (L={m.num_layers}, E={m.num_experts}, "
                     f"k={m.top_k}) in {time.perf_counter() - t0:.2f} s{extra}")


@app.command("synth")
def synth_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="output moe-trace Parquet file")],
    preset: Annotated[str | None, typer.Option(help="preset shaped after a catalog model")] = None,
    requests: Annotated[int | None, typer.Option(help="number of requests")] = None,
    prompt_len: Annotated[int | None, typer.Option(help="prompt tokens per request")] = None,
    decode_len: Annotated[int | None, typer.Option(help="decode tokens per request")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="any generator parameter, KEY=VALUE (repeatable; see `simctl trace synth-params`)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing output file")] = False,
) -> None:
    """Generate a synthetic trace from the latent-state router model."""
    from moesim.traces.synthetic.generator import parse_params, synthesize

    data: dict[str, Any] = {}
    if preset is not None:
        data["preset"] = preset
    for key, val in (("requests", requests), ("prompt_len", prompt_len), ("decode_len", decode_len), ("seed", seed)):
        if val is not None:
            data[key] = val
    data.update(_parse_sets(set_))
    params = parse_params(data)
    check_target(out, option="-o", folder=False, force=force)
    t0 = time.perf_counter()
    path, meta, rows = synthesize(params, out)
    dt = time.perf_counter() - t0
    m = meta.model
    _console().print(f"wrote {path}: {rows:,} rows, {m.name} (L={m.num_layers}, E={m.num_experts}, "
                     f"k={m.top_k}) in {dt:.2f} s ({rows / max(dt, 1e-9):,.0f} rows/s)")


def _write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (:func:`moesim.sim.core.atomic.atomic_file`:
    a temporary sibling renamed at the end, removed on an error, Ctrl-C or SIGTERM); an OS error
    becomes one line naming the path. An existing file is replaced only when moesim wrote it
    (``text`` starts with moesim's header comment, so a file written here is recognised)."""
    with atomic_file(path, option="-o", force=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _row_source(name: str) -> str:
    """The target-statistic name behind a row of :meth:`FitResult.rows`."""
    if name.startswith("reuse"):
        return "reuse"
    return {"entropy (mean)": "entropy", "next-layer acc": "next_layer_acc"}.get(name, name)


@app.command("fit")
def fit_cmd(
    file: Annotated[Path | None, typer.Argument(
        help="moe-trace Parquet file to fit (its statistics are the targets); optional with --targets/--target")] = None,
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", help="write the fitted parameters as YAML ({synthetic: ...}); a scenario takes the file as its trace:")] = None,
    preset: Annotated[str | None, typer.Option(
        help="start from this preset's knobs (without FILE: also its model and workload)")] = None,
    knobs: Annotated[str | None, typer.Option(
        help="comma-separated knobs to fit (default: all of popularity_skew, layer_correlation, token_locality, "
        "topic_strength, token_strength, lookahead_quality that the targets drive)")] = None,
    targets: Annotated[Path | None, typer.Option(
        "--targets", help="YAML mapping statistic: value (or {value, source, metric, tolerance}); overrides "
        "FILE's values")] = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", help="one target, NAME=VALUE (repeatable; overrides --targets)")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="base generator parameter KEY=VALUE (repeatable; without FILE the shape and workload too)")] = None,
    profile_requests: Annotated[int | None, typer.Option(
        "--profile-requests", min=0, help="profile split of FILE's prediction recall (default: 70%)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the calibration traces and of the fitted parameters")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Fit the synthetic generator to a trace or to given statistics: reuse, popularity, cross-layer
    correlation, and the prediction recall of lookahead, token identity and fMoE's maps."""
    from moesim.traces.analysis.recall import trace_recall
    from moesim.traces.analysis.stats import trace_stats
    from moesim.traces.synthetic.fit import ALL_KNOBS, RECALL_KNOBS, FitTarget, fit, trace_tokens
    from moesim.traces.synthetic.fit_targets import TargetValue, load_targets, parse_targets
    from moesim.traces.synthetic.generator import PRESETS, parse_params

    names = [k.strip() for k in knobs.split(",") if k.strip()] if knobs else list(ALL_KNOBS)
    for k in names:
        if k not in ALL_KNOBS:
            raise MoesimError(f"--knobs {k!r}: not a fittable knob (expected some of {', '.join(ALL_KNOBS)})")
    if preset is not None and preset not in PRESETS:
        raise MoesimError(f"--preset {preset!r}: unknown preset (known: {', '.join(PRESETS)})")
    values: dict[str, TargetValue] = {}
    sources: dict[str, str] = {}
    if targets is not None:
        values, sources = load_targets(targets)
    if target:
        given, given_src = parse_targets(_parse_sets(target, "--target"), "--target")
        values.update(given)
        sources.update(given_src)
    sets = _parse_sets(set_)
    if file is None and not values:
        raise MoesimError("give a trace FILE to fit, or targets with --targets/--target")
    base: dict[str, Any] = dict(PRESETS[preset]) if preset else {}
    if file is not None:
        st = trace_stats(file, cache_sizes=[1])
        if any(x.reuse is None for x in st.layers):
            raise MoesimError(f"{file}: no token has a previous token in its request, so reuse is undefined; "
                              "nothing to fit")
        rec = trace_recall(file, profile_requests=profile_requests) if set(names) & set(RECALL_KNOBS) else None
        base = {k: v for k, v in base.items() if k not in ("model", "requests", "prompt_len", "decode_len")}
        tgt = FitTarget.from_stats(st, rec, trace_tokens(file) if rec is not None else None)
    else:
        p = parse_params({**base, **sets})
        info = p.shape()
        tgt = FitTarget(model=p.model, num_layers=info.num_layers, num_experts=info.num_experts, top_k=info.top_k,
                        reuse=(), entropy=None, next_layer_acc=None, requests=p.requests, prompt_len=p.prompt_len,
                        decode_len=p.decode_len)
    base.update({k: v for k, v in sets.items() if file is None or k not in ("model", "num_layers", "num_experts",
                                                                              "top_k")})
    tgt = tgt.with_values(values, sources)
    t0 = time.perf_counter()
    res = fit(tgt, base=base or None, knobs=names, seed=seed)
    dt = time.perf_counter() - t0
    doc = res.synthetic_yaml()
    if out is not None:
        _write_text_atomic(out, "# moesim synthetic-trace parameters (simctl trace fit)\n"
                           + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100))
    rows = [(n, t, f, res.target.sources.get(_row_source(n), "")) for n, t, f in res.rows()]
    if as_json:
        typer.echo(json.dumps({"params": doc["synthetic"], "held": res.held,
                               "rows": [{"statistic": n, "target": t, "fitted": f, "source": s}
                                        for n, t, f, s in rows]}, indent=2))
        return
    console = _console()
    show_src = any(s and s != str(file) for *_, s in rows)
    table = Table(title=f"fit of {file if file is not None else 'the given targets'} ({dt:.1f} s)")
    for col in ("statistic", "target", "fitted", "|diff|", *(["source"] if show_src else [])):
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, t, f, src in rows:
        diff = "-" if t is None or f is None else f"{abs(t - f):.3f}"
        table.add_row(name, _num(t), _num(f), diff, *([src] if show_src else []))
    console.print(table)
    p = res.params
    loc = p.token_locality
    loc_text = ", ".join(f"{x:.3f}" for x in loc) if isinstance(loc, list) else f"{loc:.3f}"
    console.print(f"popularity_skew {p.popularity_skew:.3f}, layer_correlation {p.layer_correlation:.3f}, "
                  f"topic_strength {p.topic_strength:.3f}, token_strength {p.token_strength:.3f}, "
                  f"lookahead_quality {p.lookahead_quality:.3f}, token_locality [{loc_text}]")
    for k, why in res.held.items():
        console.print(f"{k}: not fitted ({why})")
    if out is not None:
        console.print(f"wrote {out} (a scenario synthesises its trace from these knobs with trace: {out})")


@app.command("synth-params")
def synth_params_cmd() -> None:
    """List the generator parameters with their defaults and help, and the presets."""
    from moesim.traces.synthetic.generator import PRESETS, SynthParams

    table = Table(title="simctl trace synth --set KEY=VALUE")
    for col in ("parameter", "default", "meaning"):
        table.add_column(col)
    for name, f in SynthParams.model_fields.items():
        table.add_row(name, repr(f.default), f.description or "")
    console = _console()
    console.print(table)
    console.print("presets: " + ", ".join(PRESETS))


@app.command("inspect")
def inspect_cmd(
    file: Annotated[Path, typer.Argument(help="moe-trace Parquet file")],
    rows: Annotated[int, typer.Option("--rows", "-n", min=0, help="rows to show")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
) -> None:
    """Validate a trace and show its metadata, counts and first rows."""
    from moesim.sim.core.limits import PRINTED_METADATA
    from moesim.traces.analysis.stats import trace_summary

    info = trace_summary(file, head=rows)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    from moesim.sim.core.escape import terminal

    console = _console()
    m = info["model"]   # the file's own text (names, source) is shown, never acted on: escaped
    console.print(f"[bold]{terminal(info['file'])}[/bold]: moe-trace v{terminal(info['version'])}, "
                  f"{info['bytes']:,} bytes, {info['row_groups']} row group(s), valid")
    console.print(f"model: {terminal(PRINTED_METADATA.shorten(str(m['name'])))}  layers {m['num_layers']}, experts {m['num_experts']}, "
                  f"top-k {m['top_k']}, shared {m['num_shared_experts']}")
    console.print("source: " + terminal(PRINTED_METADATA.shorten(json.dumps(info["source"], sort_keys=True, ensure_ascii=False))))
    console.print("columns: " + terminal(", ".join(info["columns"])))
    tpr = info["tokens_per_request"]
    counts = Table(title="counts")
    for col in ("phase", "rows", "tokens"):
        counts.add_column(col, justify="right")
    for ph in info["rows_by_phase"]:
        counts.add_row(terminal(ph), f"{info['rows_by_phase'][ph]:,}", f"{info['tokens_by_phase'][ph]:,}")
    counts.add_row("all", f"{info['rows']:,}", f"{info['tokens']:,}")
    console.print(counts)
    if tpr:
        console.print(f"requests: {info['requests']:,}; tokens per request min {tpr['min']}, "
                      f"mean {tpr['mean']:.1f}, max {tpr['max']}")
    if info["embedding"]:
        console.print(f"embedding: {info['embedding']['rows']:,} rows of {info['embedding']['dim']}")
    if info["head"]:
        head = Table(title=f"first {len(info['head'])} rows")
        keys = list(info["head"][0])
        for k in keys:
            head.add_column(terminal(k))
        for r in info["head"]:
            head.add_row(*[terminal(" ".join(str(x) for x in r[k]) if isinstance(r[k], list) else str(r[k]))
                           for k in keys])
        console.print(head)


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


@app.command("stats")
def stats_cmd(
    file: Annotated[Path, typer.Argument(help="moe-trace Parquet file")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    cache_sizes: Annotated[str | None, typer.Option(
        help="LRU cache sizes in experts per layer, comma-separated (default: k and E/4, E/2, 3E/4)")] = None,
    profile_requests: Annotated[int | None, typer.Option(
        "--profile-requests", min=0, help="prediction recall: the first N requests form the profile (what a "
        "policy may study: popularity, transitions, fMoE's map store), the others are evaluated "
        "(default: 70%, at least 1)")] = None,
    phase: Annotated[str, typer.Option(
        help="prediction recall: evaluate the decode tokens, the prefill tokens or all")] = "decode",
    recall: Annotated[bool, typer.Option(
        "--recall/--no-recall", help="compute the prediction recall (reads the whole trace into memory)")] = True,
) -> None:
    """Routing statistics per layer: popularity, reuse, next-layer prediction, co-activation, LRU,
    and the prediction recall of lookahead, transitions, previous/same token, popularity and fMoE's maps."""
    from moesim.traces.analysis.recall import trace_recall
    from moesim.traces.analysis.stats import trace_stats

    phases = {"decode": ("decode",), "prefill": ("prefill",), "all": ("prefill", "decode")}.get(phase)
    if phases is None:
        raise MoesimError(f"--phase {phase!r}: expected decode, prefill or all")

    sizes: list[int] | None = None
    if cache_sizes:
        try:
            sizes = [int(s) for s in cache_sizes.split(",") if s.strip()]
        except ValueError:
            raise MoesimError(f"--cache-sizes {cache_sizes!r}: expected integers separated by commas") from None
        if not sizes or min(sizes) < 1:
            raise MoesimError(f"--cache-sizes {cache_sizes!r}: sizes must be >= 1")
        from moesim.traces.format.trace_file import read_meta

        experts = read_meta(file).model.num_experts
        if max(sizes) > experts:
            raise MoesimError(f"--cache-sizes {cache_sizes!r}: a layer has only {experts} experts")
    st = trace_stats(file, cache_sizes=sizes)
    rec = trace_recall(file, profile_requests=profile_requests, phases=phases) if recall else None
    if as_json:
        doc = st.to_dict()
        if rec is not None:
            doc["recall"] = rec.to_dict()
        typer.echo(json.dumps(doc, indent=2))
        return
    m = st.meta.model
    console = _console()
    console.print(f"[bold]{st.path}[/bold]: {m.name} (L={m.num_layers}, E={m.num_experts}, k={m.top_k}); "
                  f"{st.requests:,} requests, {st.tokens:,} tokens "
                  f"({', '.join(f'{v:,} {k}' for k, v in st.tokens_by_phase.items())}), {st.rows:,} rows")
    table = Table()
    for col in ("layer", "entropy", "top-10%", "reuse", "next-layer", "coact sparsity",
                *[f"LRU@{s}" for s in st.cache_sizes]):
        table.add_column(col, justify="right")
    for ls in [*st.layers, st.overall]:
        table.add_row("all" if ls.layer < 0 else str(ls.layer), _num(ls.entropy), _pct(ls.top10_share),
                      _pct(ls.reuse), _pct(ls.next_layer_acc), _num(ls.coact_sparsity),
                      *[_pct(ls.lru[s]) for s in st.cache_sizes], end_section=ls is st.layers[-1])
    console.print(table)
    console.print(f"entropy: of expert popularity, / log E; top-10%: share of selections to the top "
                  f"{math.ceil(m.num_experts / 10)} experts; reuse: share of the top-{m.top_k} shared with the "
                  f"previous token of the request (chance {100 * st.chance_reuse:.1f}%)")
    console.print("next-layer: top-k of lookahead_logits vs the next layer's experts; coact sparsity: "
                  "1 - (pairs holding 90% of co-activations) / (all pairs); LRU@C: hit rate with C experts "
                  "of the layer cached, a token's experts looked up together (the hit_rate of simctl run "
                  "with policy lru, cache.experts_per_layer C, batch 1, all requests)")
    if rec is not None:
        _print_recall(console, rec)


_RECALL_HEADS = {"lookahead": "lookahead", "transition@1": "trans@1", "transition@2": "trans@2",
                 "transition@3": "trans@3", "previous_token": "prev-token", "same_token": "same-token",
                 "popularity": "popularity", "semantic": "semantic", "trajectory@1": "traj@1",
                 "trajectory@2": "traj@2", "trajectory@3": "traj@3"}


def _print_recall(console: Console, rec: Any) -> None:
    """The prediction-recall table of ``simctl trace stats`` (a :class:`RecallStats`)."""
    names = [m for m in _RECALL_HEADS if m not in rec.missing]
    console.print(f"prediction recall (top-k guess vs routed experts): profile = the first {rec.profile_requests} "
                  f"request(s) ({rec.store_maps:,} iterations in the map store), evaluated = {rec.eval_tokens:,} "
                  f"{'+'.join(rec.phases)} token(s) of the other {rec.eval_requests}; chance {100 * rec.chance:.1f}%")
    table = Table()
    table.add_column("layer", justify="right")
    for m in names:
        table.add_column(_RECALL_HEADS[m], justify="right")
    L = len(rec.layers["previous_token"]) if rec.layers else 0
    for lay in range(L):
        table.add_row(str(lay), *[_pct(rec.layers[m][lay]) for m in names], end_section=lay == L - 1)
    table.add_row("all", *[_pct(rec.overall[m]) for m in names])
    console.print(table)
    console.print("by target layer. lookahead: top-k of lookahead_logits of the layer before; trans@d: co-routing "
                  "counts of the profile from d layers before (promoe-style); prev-token: the request's previous "
                  "token; same-token: the latest earlier token of the same id; popularity: the profile's k most "
                  "routed; semantic / traj@d: fMoE's expert maps matched by embedding / by the iteration's "
                  "layers up to d before (README, \"Prediction recall\")")
    for m, why in rec.missing.items():
        console.print(f"{_RECALL_HEADS[m]}: not measured ({why})")
