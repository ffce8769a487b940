"""What constrained decoding buys and costs with the bundled SmolLM2-135M on this CPU.

    python benchmarks/constrained_decoding.py [--prompts 24] [--max-tokens 96]
        [--json benchmarks/results/constrained.json]

1. Forced tool calls (`tool_choice: "required"` over three tools, and a named tool): the
   share of replies that parse into a call whose arguments fit the tool's JSON schema, with
   Wilson intervals, without the constraint (the forced prefix only, as before issue 28)
   and with it (the default now). Greedy decoding, one prompt per request.
2. The cost per token: the same prompts generated free and under a JSON schema
   (`response_format`), at batch 1 and 8: seconds per generated token, and the time the
   logits processor spent computing and applying masks (per step and its share).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jsonschema

from workbench.evaluate.stats import wilson_interval
from workbench.models import load_model
from workbench.models.base import GenerationParams
from workbench.models.constrain import Constraint, GrammarProcessor
from workbench.models.local import _with_tool_calls
from workbench.records import ToolSpec

TOOLS = [
    ToolSpec.of("get_weather", "Weather forecast for a city", {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string", "maxLength": 40},
                       "days": {"type": "integer", "minimum": 1, "maximum": 14}}}),
    ToolSpec.of("search", "Search the web", {
        "type": "object", "additionalProperties": False, "required": ["query"],
        "properties": {"query": {"type": "string", "maxLength": 80}}}),
    ToolSpec.of("convert_units", "Convert a quantity between units", {
        "type": "object", "additionalProperties": False,
        "required": ["value", "from_unit", "to_unit"],
        "properties": {"value": {"type": "number"}, "from_unit": {"type": "string",
                                                                  "maxLength": 20},
                       "to_unit": {"type": "string", "maxLength": 20}}}),
]
SCHEMAS = {t.name: t.function.parameters for t in TOOLS}
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Cairo", "Quito", "Perth"]
ASKS = ["What will the weather be in {c} over the next {n} days?",
        "Find recent news about {c}.",
        "Convert {n} miles to kilometres.",
        "Search for the population of {c}."]
VERDICT = {"type": "object", "additionalProperties": False,
           "required": ["answer", "confidence", "reason"],
           "properties": {"answer": {"enum": ["yes", "no"]},
                          "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
                          "reason": {"type": "string", "maxLength": 200}}}


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": ASKS[i % len(ASKS)].format(
        c=CITIES[i % len(CITIES)], n=3 + i % 5)}] for i in range(n)]


def valid_call(gen) -> bool:
    if len(gen.tool_calls) != 1:
        return False
    call = gen.tool_calls[0].function
    try:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return True


def forced_calls(model, convs, choice, max_tokens: int, constrained: bool) -> dict:
    params = GenerationParams(max_tokens=max_tokens)
    ok, t0, tokens = 0, time.perf_counter(), 0
    for conv in convs:
        if constrained:
            gen = model.generate([conv], params, tools=TOOLS, tool_choice=choice)[0]
        else:  # the path before issue 28: the forced prefix, then free text, then parsing
            specs, ch = model._tool_request(TOOLS, choice)
            prompt, prefix = model._prompt(conv, specs, ch)
            gen = model._generate_batch([prompt], params, add_special_tokens=False,
                                        keep_markers=True)[0]
            gen = _with_tool_calls(gen, prefix, model.template_tools.family,
                                   [t.name for t in TOOLS])
        ok += valid_call(gen)
        tokens += gen.completion_tokens
    lo, hi = wilson_interval(ok, len(convs))
    return {"valid": ok, "n": len(convs), "rate": round(ok / len(convs), 3),
            "interval": [round(lo, 3), round(hi, 3)],
            "s_per_token": round((time.perf_counter() - t0) / max(tokens, 1), 4)}


def cost(model, convs, batch: int, max_tokens: int, constraint) -> dict:
    seen: list[GrammarProcessor] = []
    make = model.grammar_processor

    def spy(c, b):
        p = make(c, b)
        seen.append(p)
        return p

    model.grammar_processor = spy
    model.opts.batch_size = batch
    try:
        t0, tokens, parsed = time.perf_counter(), 0, 0
        for i in range(0, len(convs), batch):
            gens = model.generate(convs[i:i + batch], GenerationParams(
                max_tokens=max_tokens, constraint=constraint))
            tokens += sum(g.completion_tokens for g in gens)
            for g in gens:
                try:
                    jsonschema.validate(json.loads(g.text), VERDICT)
                    parsed += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
        wall = time.perf_counter() - t0
    finally:
        del model.grammar_processor
    mask_s = sum(p.seconds for p in seen)
    steps = sum(p.steps for p in seen)
    return {"batch": batch, "constrained": constraint is not None, "tokens": tokens,
            "s_per_token": round(wall / max(tokens, 1), 4),
            "valid_json": f"{parsed}/{len(convs)}",
            "mask_ms_per_step": round(1000 * mask_s / steps, 3) if steps else None,
            "mask_share": round(mask_s / wall, 3) if seen else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = load_model("default")
    convs = prompts(args.prompts)
    out: dict = {"prompts": args.prompts, "max_tokens": args.max_tokens, "forced": {}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    for label, choice in [("required", "required"), ("named get_weather", named)]:
        for constrained in (False, True):
            r = forced_calls(model, convs, choice, args.max_tokens, constrained)
            key = f"{label}, {'constrained' if constrained else 'prefix only'}"
            out["forced"][key] = r
            print(f"{key}: {r['valid']}/{r['n']} valid calls ({r['rate']:.0%}, 95% CI "
                  f"{r['interval'][0]:.2f}-{r['interval'][1]:.2f}), {r['s_per_token']} s/token",
                  flush=True)
    verdict = [[{"role": "user", "content": c[0]["content"] + " Reply in JSON with answer "
                 "(yes/no), confidence (0-100) and reason."}] for c in convs[:16]]
    out["cost"] = []
    for batch in (1, 8):
        for constraint in (None, Constraint.json_schema(VERDICT)):
            r = cost(model, verdict, batch, args.max_tokens, constraint)
            out["cost"].append(r)
            print(f"cost: {r}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
