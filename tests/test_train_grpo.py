"""GRPO in the training library, on the tiny random-init Llama and scripted models: advantages
and group statistics, which tokens are the policy's (a tool observation's get no gradient),
the loss against hand-computed values, an exact kill-and-resume, and a reward that prefers one
answer moving the policy toward it; then on-policy distillation on the same rollouts (its
loss by hand, its mask, a teacher pulling the student, self-distillation's privileged prompt,
the protocol teacher's token alignment, resume)."""

import json
import math

import pytest

from workbench.agents.rollout import Rollout, group_stats, sample_groups
from workbench.agents.runner import (
    AgentSetup,
    AgentTask,
    Budget,
    ErrorPolicy,
    FreePolicy,
    GuidedPolicy,
)
from workbench.agents.tools import Tool, Toolbox
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.models import load_model
from workbench.models.base import Capabilities, GenerationParams
from workbench.records import ToolCall
from workbench.train import grpo_session as G
from workbench.train.config import TrainConfig
from workbench.train.grpo import (
    PolicySequence,
    group_advantages,
    grpo_token_loss,
    seq_batch,
    token_logps,
    token_weights,
    tokenize_rollout,
)

ANSWER = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["YES", "NO"]}},
          "required": ["label"], "additionalProperties": False}
LOOKUP = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
          "additionalProperties": False}
SECRET = "ZEBRA-OBSERVATION-7731"


def toolbox():
    return Toolbox([Tool("lookup", "Look a key up.", LOOKUP, lambda key: f"{SECRET} {key}"),
                    Tool("answer", "Give the verdict.", ANSWER, lambda label: {"label": label},
                         final=True)])


def call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def tasks(n, prefix="t"):
    return [AgentTask(f"{prefix}{i}", f"Is claim {i} true?") for i in range(n)]


def guided_setup(sampling: G.Sampling) -> AgentSetup:
    """Guided choice between the two verdicts: sampling over the candidates' scores."""
    def propose(state, allowed):
        return [ToolCall.make("answer", {"label": x}) for x in ("YES", "NO")]
    box = toolbox()
    return AgentSetup(toolbox=box, system="Answer.", budget=Budget(max_steps=1),
                      policy=GuidedPolicy(propose, temperature=sampling.temperature,
                                          seed=sampling.seed, final_names=box.final_names))


def free_setup(sampling: G.Sampling) -> AgentSetup:
    """The model writes its turns (a random model: text, no call): tokens are sampled."""
    return AgentSetup(toolbox=toolbox(), system="Answer.", budget=Budget(max_steps=2),
                      errors=ErrorPolicy(max_errors=5),
                      policy=FreePolicy(GenerationParams(
                          max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                          seed=sampling.seed if sampling.temperature else None),
                          constrained=False))


def prefers_yes(t):
    return 1.0 if (t.final or {}).get("label") == "YES" else 0.0


def text_parity(t):
    """A reward a random model's text earns about half the time."""
    first = next(m for m in t.messages if m.role == "assistant")
    return float(len(first.content or "") % 2 == 0)


def config(**kw):
    grpo = {"group_size": 4, "tasks_per_step": 2, "temperature": 1.0, "max_new_tokens": 6,
            **kw.pop("grpo", {})}
    base = {"method": "grpo", "max_length": 512, "batch_size": 4, "learning_rate": 1e-2,
            "max_steps": 4, "warmup_ratio": 0.0, "scheduler": "constant",
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0}, "grpo": grpo}
    base.update(kw)
    return TrainConfig(**base)


def session(tiny_model, *, agent_setup=guided_setup, reward=prefers_yes, n_tasks=6,
            held_out=(), checkpoint_dir=None, teacher=None, **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return G.setup(config(**kw), model=model, tokenizer=tok, tasks=tasks(n_tasks),
                   agent_setup=agent_setup, reward=reward, held_out=list(held_out), seed=3,
                   checkpoint_dir=checkpoint_dir, teacher=teacher)


# --- advantages, groups, masks ------------------------------------------------------------------

def test_advantages_are_normalised_within_groups():
    adv = group_advantages([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 0.0]])
    sd = math.sqrt(1 / 3)  # sample std of 1, 0, 0, 1
    assert adv[0] == pytest.approx([0.5 / (sd + 1e-4), -0.5 / (sd + 1e-4)] * 1
                                   + [-0.5 / (sd + 1e-4), 0.5 / (sd + 1e-4)])
    assert adv[1] == [0.0] * 4  # no signal: nothing to learn from this group
    assert adv[2] == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-4),
                                    -0.5 / (math.sqrt(0.5) + 1e-4)])
    assert group_advantages([[2.0, 0.0]], scale="none") == [[1.0, -1.0]]


def test_rollouts_form_groups_with_the_packs_reward_and_their_statistics():
    replies = [call("lookup", key="k"), call("answer", label="YES"),
               call("answer", label="NO")]
    model = load_model("fake", responses=replies)
    setup = AgentSetup(toolbox=toolbox(), system="Answer.", budget=Budget(max_steps=3))
    groups = sample_groups(model, tasks(2), setup, group_size=3, reward=prefers_yes)
    assert [[r.trajectory.task_id for r in g] for g in groups] == \
        [["t0#0", "t0#1", "t0#2"], ["t1#0", "t1#1", "t1#2"]]
    assert all(r.group == f"t{i}" and r.trajectory.metadata["group"] == f"t{i}"
               for i, g in enumerate(groups) for r in g)
    # one batched call per turn for all six runs (lockstep)
    assert model.batches[0] == 6
    st = group_stats(groups)
    rewards = [r.reward for g in groups for r in g]
    assert st["reward_mean"] == pytest.approx(sum(rewards) / 6)
    assert 0 <= st["groups_no_signal"] <= 1 and st["tool_calls_per_rollout"] > 0
    same = [[Rollout(group="a", sample=k, reward=1.0, trajectory=groups[0][0].trajectory)
             for k in range(3)]]
    assert group_stats(same)["groups_no_signal"] == 1.0
    assert group_stats(same)["reward_std_in_group"] == 0.0


def scripted_rollout(metadata=None):
    replies = [call("lookup", key="alpha"), call("answer", label="YES")]
    setup = AgentSetup(toolbox=toolbox(), system="Answer.", budget=Budget(max_steps=3))
    task = AgentTask("t0", "Is claim 0 true?", metadata=dict(metadata or {}))
    (g,) = sample_groups(load_model("fake", responses=replies), [task], setup,
                         group_size=1, reward=prefers_yes)
    return g[0]


def test_only_the_policys_own_tokens_are_marked(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    r = scripted_rollout()
    assert r.reward == 1.0 and r.trajectory.tool_calls == 1
    seq = tokenize_rollout(tok, r, max_length=1024)
    own = tok.decode([i for i, m in zip(seq.input_ids, seq.mask, strict=True) if m])
    other = tok.decode([i for i, m in zip(seq.input_ids, seq.mask, strict=True) if not m])
    assert '"lookup"' in own and '"YES"' in own  # the calls the policy wrote
    assert SECRET not in own and SECRET in other  # the tool's observation: context
    assert "Is claim 0 true?" in other and "Answer." in other  # the prompt: context
    cut = tokenize_rollout(tok, r, max_length=20)
    assert len(cut.input_ids) == 20 and sum(cut.mask) == 0 and cut.extra["truncated"]
    assert not seq.extra["truncated"]


def test_a_tool_observation_gets_no_gradient(tiny_model, monkeypatch):
    """Through the generic path (full logits), the loss's gradient reaches the logits only at
    positions that predict the policy's tokens: none at the observation's or the prompt's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.train import step

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    seq = tokenize_rollout(tok, scripted_rollout(), max_length=1024)
    seq.advantage = 1.0
    b = seq_batch([seq], tok.pad_token_id, "cpu")
    captured = {}

    def keep_logits(module, args, out):
        out.retain_grad()
        captured["logits"] = out

    model.get_output_embeddings().register_forward_hook(keep_logits)
    monkeypatch.setattr(step, "decoder_and_head", lambda m: None)
    logp = token_logps(model, b)
    assert logp.numel() == seq.n_policy
    loss, _ = grpo_token_loss(logp, logp.detach(), torch.ones_like(logp), epsilon=0.2,
                              epsilon_high=0.2)
    loss.sum().backward()
    grad = captured["logits"].grad[0].abs().sum(dim=-1)  # per position
    predicts_policy = torch.tensor(seq.mask[1:] + [0], dtype=torch.bool)
    assert (grad[~predicts_policy] == 0).all()
    assert (grad[predicts_policy] > 0).all()
    ids = torch.tensor(seq.input_ids)
    secret = tok(SECRET, add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i:i + len(secret)].tolist() == secret)
    assert (grad[start - 1:start - 1 + len(secret)] == 0).all()  # no gradient for them


def test_a_shared_prompt_runs_once_with_the_same_values_and_gradients(tiny_model):
    """The rollouts of a task share their prompt: run once, its key/value cache repeated
    for each rollout, it gives what running every rollout whole gives."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.train.adapter import with_adapter
    from workbench.train.config import LoraSettings

    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    model = with_adapter(AutoModelForCausalLM.from_pretrained(tiny_model),
                         LoraSettings(r=4, alpha=8, dropout=0.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)  # an adapter that is not the base model
    replies = [call("lookup", key="alpha"), call("answer", label="YES"),
               call("answer", label="NO"), call("lookup", key="a much longer key")]
    setup = AgentSetup(toolbox=toolbox(), system="Answer. " * 20, budget=Budget(max_steps=3))
    (g,) = sample_groups(load_model("fake", responses=replies), tasks(1), setup,
                         group_size=3, reward=prefers_yes)
    seqs = [tokenize_rollout(tok, r, max_length=1024) for r in g]
    params = [p for p in model.parameters() if p.requires_grad]
    got = {}
    for share in (False, True):
        b = seq_batch(seqs, tok.pad_token_id, "cpu", share_prefix=share)
        assert bool(b.prefix) == share
        logp = token_logps(model, b)
        got[share] = (logp.detach(), torch.autograd.grad(logp.sum(), params))
    assert seqs[0].input_ids[:60] == seqs[1].input_ids[:60]
    assert torch.allclose(got[False][0], got[True][0], atol=1e-5)
    for a, b in zip(got[False][1], got[True][1], strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


# --- the loss ------------------------------------------------------------------------------------

def test_the_token_loss_equals_hand_computed_values():
    import torch

    logp = torch.tensor([-1.0, -2.0, -0.5])
    old = torch.tensor([-1.2, -1.5, -0.5])
    ref = torch.tensor([-1.1, -2.0, -0.7])
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, st = grpo_token_loss(logp, old, adv, epsilon=0.2, epsilon_high=0.2, beta=0.1,
                               ref_logp=ref)
    # token 1: ratio e^0.2 = 1.2214 > 1.2 with A > 0: clipped to 1.2
    # token 2: ratio e^-0.5 = 0.6065 < 0.8 with A < 0: min(-0.6065, -0.8) = -0.8
    # token 3: ratio 1: -2; KL k3 = e^(ref - logp) - (ref - logp) - 1
    k3 = [math.exp(-0.1) + 0.1 - 1, 0.0, math.exp(-0.2) + 0.2 - 1]
    want = [-1.2 + 0.1 * k3[0], 0.8 + 0.1 * k3[1], -2.0 + 0.1 * k3[2]]
    assert loss.tolist() == pytest.approx(want, abs=1e-6)
    assert st["clipped"].tolist() == [True, True, False]
    assert st["kl"].tolist() == pytest.approx(k3, abs=1e-6)
    # DAPO's clip-higher: a wider range above 1 leaves token 1 unclipped
    loss, st = grpo_token_loss(logp, old, adv, epsilon=0.2, epsilon_high=0.28)
    assert loss[0].item() == pytest.approx(-math.exp(0.2), abs=1e-6)
    assert st["clipped"].tolist() == [False, True, False]


def fixed_sequences(tok):
    """Two rollouts with hand-set advantages (a fixed batch)."""
    r = scripted_rollout()
    a = tokenize_rollout(tok, r, max_length=1024)
    b = PolicySequence(id="b", group="g", input_ids=a.input_ids[:-6], mask=a.mask[:-6],
                       reward=0.0)
    a.advantage, b.advantage = 0.75, -1.5
    return [a, b]


@pytest.mark.parametrize("kind", ["token", "sequence"])
def test_the_step_loss_on_a_fixed_batch_equals_its_hand_computed_value(tiny_model, kind):
    """With one update per batch the ratio is 1, so the loss is -sum(A_i n_i) / N (token
    mean) or -mean(A_i) (sequence mean), whatever the model; the update changes the
    adapter, and tokens of a zero-advantage rollout are never run."""
    s = session(tiny_model, grpo={"loss": kind}, batch_size=1)
    seqs = fixed_sequences(s.tokenizer)
    n = [q.n_policy for q in seqs]
    want = -(0.75 * n[0] - 1.5 * n[1]) / sum(n) if kind == "token" else -(0.75 - 1.5) / 2
    assert token_weights(seqs, kind) == pytest.approx(
        [1 / sum(n)] * 2 if kind == "token" else [1 / (2 * n[0]), 1 / (2 * n[1])])
    before = {k: v.clone() for k, v in G.adapter_state(s).items()}
    st = G.update(s, seqs)
    assert st["loss"] == pytest.approx(want, abs=1e-6)
    assert st["clip_fraction"] == 0.0 and st["grad_norm"] > 0
    after = G.adapter_state(s)
    assert any(not bool((after[k] == before[k]).all()) for k in before)
    seqs[1].advantage = 0.0
    seqs[0].advantage = 0.0
    assert G.update(s, seqs)["update_tokens"] == 0  # nothing to learn: no forward pass


def test_kl_to_the_starting_policy_is_zero_at_the_start_and_grows(tiny_model):
    s = session(tiny_model, grpo={"beta": 0.5, "iterations": 2}, batch_size=2)
    seqs = fixed_sequences(s.tokenizer)
    st = G.update(s, seqs)
    assert st["kl"] > 0  # the second iteration sees the first update
    assert seqs[0].ref_logps == pytest.approx(seqs[0].old_logps, abs=1e-5)  # start = ref


# --- the session ---------------------------------------------------------------------------------

def test_kill_and_resume_is_exact(tiny_model, tmp_path):
    """Four steps at once against two, a stop, and two more from the checkpoint; and a kill
    after step 3's rollouts were saved, resumed from step 2's checkpoint: the same adapter
    (within 1e-6) and the same rewards. Rollouts are sampled tokens (free policy)."""
    kw = {"agent_setup": free_setup, "reward": text_parity, "save_every": 2}
    whole = session(tiny_model, checkpoint_dir=tmp_path / "whole", **kw)
    rows = G.train_steps(whole, 4)
    assert any(r["groups_no_signal"] < 1 for r in rows)
    ck = tmp_path / "ck"
    first = session(tiny_model, checkpoint_dir=ck, **kw)
    with pytest.raises(TrainingInterrupted) as e:
        G.train_steps(first, 4, should_stop=lambda: first.step == 2)
    assert e.value.step == 2

    def boom(stage):
        if stage == "rollouts" and killed.step == 2:
            raise RuntimeError("killed")

    killed = session(tiny_model, checkpoint_dir=ck, **kw)
    assert G.restore_checkpoint(killed).name == "checkpoint-2"
    with pytest.raises(RuntimeError, match="killed"):
        G.train_steps(killed, 2, fault=boom)
    assert (ck / "rollouts" / "step-000003.jsonl").is_file()
    resumed = session(tiny_model, checkpoint_dir=ck, **kw)
    G.restore_checkpoint(resumed)
    more = G.train_steps(resumed, 2)
    assert more[0]["rollouts_reread"] is True and more[1]["rollouts_reread"] is False
    a, b = G.adapter_state(whole), G.adapter_state(resumed)
    assert set(a) == set(b)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    for x, y in zip(rows, resumed.metrics, strict=True):
        assert x["reward_mean"] == y["reward_mean"]
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)


def yes_margin(s):
    """Mean log-probability of the YES call minus the NO call, over the session's tasks."""
    import torch

    from workbench.models.base import ScoreRequest
    from workbench.models.tools import TemplateTools, template_messages, tool_call_text

    m = G.policy_model(s, 8)
    box = toolbox()
    out = []
    with torch.no_grad():
        for t in s.tasks:
            conv = [{"role": "system", "content": "Answer."},
                    {"role": "user", "content": t.prompt}]
            box_prompt = template_messages(conv, TemplateTools.of(None), box.specs())
            texts = [tool_call_text([ToolCall.make("answer", {"label": x})
                                     .model_dump(mode="json")]) for x in ("YES", "NO")]
            yes, no = m.score([ScoreRequest(prompt=box_prompt, continuations=texts)])[0]
            out.append(yes.logprob - no.logprob)
    return sum(out) / len(out)


def test_a_reward_that_prefers_one_answer_moves_the_policy_toward_it(tiny_model, tmp_path):
    s = session(tiny_model, held_out=tasks(4, "dev"), max_steps=4, grpo={"eval_every": 2})
    before = yes_margin(s)
    rows = G.train_steps(s, 4)
    after = yes_margin(s)
    assert after > before + 1.0, (before, after)
    # the greedy guided choice on tasks it never trained on: NO everywhere at the start
    # (this seed), YES everywhere after
    assert s.start_reward < 1.0 and rows[-1]["heldout_reward"] == 1.0
    for k in ("reward_mean", "reward_std_in_group", "groups_no_signal", "clip_fraction",
              "tool_calls_per_rollout", "rollout_tokens_per_s", "update_tokens_per_s",
              "rollouts_truncated"):
        assert k in rows[0], k
    assert rows[-1]["heldout_reward"] >= s.start_reward and s.best_step is not None
    m = G.export(s, tmp_path / "adapter")
    assert m["outputs"]["adapter_step"] == s.best_step
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_grpo_is_refused_where_it_cannot_run(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.train.session import setup

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    with pytest.raises(WorkbenchError, match="agent pipeline runs it"):
        setup(config(), model=model, tokenizer=tok, examples=[])
    with pytest.raises(WorkbenchError, match="needs tasks"):
        G.setup(config(), model=model, tokenizer=tok, tasks=[], agent_setup=guided_setup,
                reward=prefers_yes)
    s = session(tiny_model, max_steps=2)
    with pytest.raises(WorkbenchError, match="cannot run 3 steps"):
        G.train_steps(s, 3)


# --- the packs' rewards ----------------------------------------------------------------------------

def test_the_rf_and_kgv_packs_declare_their_rewards():
    from workbench.agent_packs.config import AgentConfig
    from workbench.agent_packs.kgv import api as kgv
    from workbench.agent_packs.rf import api as rf
    from workbench.agent_packs.rf.bench import DesignItem

    item = DesignItem(id="rfd-x", question="A 50 ohm line is terminated in a 75 ohm resistive "
                      "load. What is the VSWR on the line?", answer=1.5, quantity="vswr",
                      tool="reflection", family="vswr")
    ac = AgentConfig(pack="rf", policy="free_unconstrained")
    right = [call("reflection", load="75 ohm", z0="50 ohm"), call("answer", value=1.5)]
    wrong = [call("answer", value=2.0)]
    mistake = ["no idea", call("answer", value=1.5)]
    got = []
    for replies in (right, wrong, mistake):
        (g,) = sample_groups(load_model("fake", responses=replies), [rf.design_task(item)],
                             rf.tools_setup(ac), group_size=1, reward=rf.reward)
        got.append(g[0].reward)
    assert got == pytest.approx([1.0, 0.0, 1.0 - rf.FORMAT_PENALTY])

    # KGV: the gold label, less 0.1 a search (AgentKGV's cost of retrieval)
    claim = {"label": "SUPPORTED"}
    search = Tool("search", "Search.", LOOKUP, lambda key: "hits")
    verdict = {"type": "object", "properties": {"label": {"type": "string"}},
               "required": ["label"]}
    box = Toolbox([search, Tool("verdict", "Verdict.", verdict,
                                lambda label: {"label": label}, final=True)])
    replies = [call("search", key="a"), call("search", key="b"),
               call("verdict", label="SUPPORTED")]
    (g,) = sample_groups(load_model("fake", responses=replies),
                         [AgentTask("c1", "Is it so?", metadata={"claim": claim})],
                         AgentSetup(toolbox=box, budget=Budget(max_steps=4)), group_size=1,
                         reward=kgv.reward)
    assert g[0].reward == pytest.approx(1.0 - 2 * 0.1)


def test_the_recipe_stops_on_sigterm_resumes_and_keeps_its_rollouts(tiny_model, tmp_path):
    import os
    import signal

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.train.grpo_recipe import train_grpo

    out = tmp_path / "adapter"
    logs: list[str] = []

    def run(on_step=None):
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        tok = AutoTokenizer.from_pretrained(tiny_model)
        return train_grpo(config(max_steps=2), model=model, tokenizer=tok, tasks=tasks(4),
                          agent_setup=guided_setup, reward=prefers_yes, output=out,
                          on_step=on_step, log=logs.append)

    def term(step, row):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as e:
        run(term)
    assert e.value.code == 143 and not out.exists()
    assert (tmp_path / ".adapter.checkpoints" / "checkpoint-1").is_dir()
    res = run()
    assert any("resuming from checkpoint-1" in x for x in logs)
    assert res.steps == 2 and (out / "adapter_model.safetensors").is_file()
    assert not (tmp_path / ".adapter.checkpoints").exists()
    assert sorted(p.name for p in (tmp_path / "adapter.rollouts").iterdir()) == \
        ["step-000001.jsonl", "step-000002.jsonl"]
    live = (tmp_path / "adapter.live.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in live] == [1, 2]
    assert json.loads((out / "manifest.json").read_text())["outputs"]["adapter_step"] == 2


def test_a_groups_identical_questions_are_scored_once(monkeypatch):
    """The G rollouts of a task ask a guided policy the same first question: scored once,
    each rollout still sampling its own choice."""
    model = load_model("fake")
    seen = []
    real = model.score

    def counted(requests):
        seen.append(len(requests))
        return real(requests)

    monkeypatch.setattr(model, "score", counted)
    setup = guided_setup(G.Sampling(temperature=5.0, seed=1, max_tokens=8))
    groups = sample_groups(model, tasks(2), setup, group_size=4, reward=prefers_yes)
    assert seen == [2]  # 8 runs, 2 distinct questions
    labels = {r.trajectory.final["label"] for g in groups for r in g}
    assert labels == {"YES", "NO"}  # sampled per rollout


def test_the_kl_reference_is_the_starting_adapter_when_training_starts_from_one(tiny_model,
                                                                               tmp_path):
    """train.init_adapter (e.g. SFT before GRPO) is the KL reference: swapped in for the
    reference pass, and the adapter being trained is put back after it."""
    import torch

    first = session(tiny_model)
    seqs = fixed_sequences(first.tokenizer)
    G.update(first, seqs)  # an adapter that is not the base model
    G.export(first, tmp_path / "start")
    s = session(tiny_model, init_adapter=str(tmp_path / "start"),
                grpo={"beta": 0.5, "iterations": 2}, batch_size=2)
    assert s.reference is not None
    start = {k: v.clone() for k, v in G.adapter_state(s).items()}
    assert all(torch.equal(start[k], first_v) for k, first_v in G.adapter_state(first).items())
    seqs = fixed_sequences(s.tokenizer)
    st = G.update(s, seqs)
    # the reference is the starting adapter, not the base model
    assert seqs[0].ref_logps == pytest.approx(seqs[0].old_logps, abs=1e-5)
    assert st["kl"] > 0
    after = G.adapter_state(s)
    assert any(not torch.equal(after[k], start[k]) for k in start)  # trained, not reset
    base = session(tiny_model, grpo={"beta": 0.5})
    ref_base = G._no_grad_logps(base, seqs[:1], reference=True)[0]
    assert max(abs(a - b) for a, b in zip(ref_base, seqs[0].ref_logps, strict=True)) > 1e-4


def test_each_pass_over_the_tasks_takes_every_task_once_in_a_seeded_order():
    from types import SimpleNamespace

    def fake(seed):
        return SimpleNamespace(cfg=config(grpo={"tasks_per_step": 3}), tasks=tasks(6),
                               seed=seed)

    s = fake(3)
    first = [t.id for step in range(2) for t in G.step_tasks(s, step)]
    second = [t.id for step in range(2, 4) for t in G.step_tasks(s, step)]
    assert sorted(first) == sorted(second) == [f"t{i}" for i in range(6)]
    assert first != second  # a new order each pass
    assert first == [t.id for step in range(2) for t in G.step_tasks(fake(3), step)]
    assert first != [t.id for step in range(2) for t in G.step_tasks(fake(4), step)]


# --- on-policy distillation ------------------------------------------------------------------------

def test_the_distillation_loss_equals_hand_computed_values(tiny_model):
    """Per token, the advantage gains weight x (teacher - student) log-prob; with one update
    per batch the step's loss is reward_weight x GRPO's plus weight x mean(student -
    teacher), and the logged distill_kl is that mean (the sampled reverse KL)."""
    import torch

    from workbench.train.grpo_distill import distill_advantages

    logp = torch.tensor([-1.0, -2.0, -0.5])
    teacher = torch.tensor([-0.2, -3.0, -0.5])
    adv = 0.5 * torch.tensor([1.0, 1.0, -2.0]) + 2.0 * distill_advantages(logp, teacher)
    loss, _ = grpo_token_loss(logp, logp, adv, epsilon=0.2, epsilon_high=0.2)
    # ratio 1: loss = -(0.5 A + 2 (T - logp)) = [-(0.5 + 1.6), -(0.5 - 2), -(-1 + 0)]
    assert loss.tolist() == pytest.approx([-2.1, 1.5, 1.0], abs=1e-6)

    for rw in (0.0, 1.0):
        s = session(tiny_model, grpo={"distill": {"weight": 0.5, "reward_weight": rw}},
                    batch_size=1)
        seqs = fixed_sequences(s.tokenizer)
        for q in seqs:
            q.teacher_logps = [-3.0] * q.n_policy
        student = torch.cat([token_logps(s.model, seq_batch([q], s.tokenizer.pad_token_id,
                                                            "cpu")).detach() for q in seqs])
        n = [q.n_policy for q in seqs]
        gap = float((student + 3.0).mean())
        want = rw * -(0.75 * n[0] - 1.5 * n[1]) / sum(n) + 0.5 * gap
        st = G.update(s, seqs)
        assert st["loss"] == pytest.approx(want, abs=1e-5)
        assert st["distill_kl"] == pytest.approx(gap, abs=1e-5)
    with pytest.raises(ValueError, match="reward_weight is 0 with distillation off"):
        config(grpo={"distill": {"reward_weight": 0.0}})


def test_distillation_gives_no_gradient_to_tool_observations(tiny_model, monkeypatch):
    """Distillation only, on a rollout whose reward advantage is 0: the gradient reaches the
    logits at positions predicting the policy's tokens and nowhere else (not the tool's
    observation, not the prompt)."""
    import torch

    from workbench.train import step

    s = session(tiny_model, grpo={"distill": {"weight": 1.0, "reward_weight": 0.0}})
    seq = tokenize_rollout(s.tokenizer, scripted_rollout(), max_length=1024)
    seq.advantage = 0.0
    seq.teacher_logps = [-float(i % 5) for i in range(seq.n_policy)]
    captured = {}

    def keep_logits(module, args, out):
        out.retain_grad()
        captured["logits"] = out

    s.model.get_output_embeddings().register_forward_hook(keep_logits)
    monkeypatch.setattr(step, "decoder_and_head", lambda m: None)
    st = G.update(s, [seq])
    assert st["update_tokens"] > 0 and st["grad_norm"] > 0
    grad = captured["logits"].grad[0].abs().sum(dim=-1)
    predicts_policy = torch.tensor(seq.mask[1:] + [0], dtype=torch.bool)
    assert (grad[~predicts_policy] == 0).all()
    assert (grad[predicts_policy] > 0).all()
    assert SECRET in s.tokenizer.decode([i for i, m in zip(seq.input_ids, seq.mask,
                                                           strict=True) if not m])


class PrefersYes:
    """A teacher through the models protocol: the student's starting weights (the same
    log-probs on every token) except that it finds "NO" very unlikely and "YES" likely."""

    identity = "test:prefers-yes"
    backend_name = "test"
    capabilities = Capabilities(token_logprobs=True)

    def __init__(self, tiny_model, tok):
        from transformers import AutoModelForCausalLM

        from workbench.models.local import LocalChatModel

        self.inner = LocalChatModel.wrap(AutoModelForCausalLM.from_pretrained(tiny_model), tok,
                                         device="cpu", identity="tiny")
        self.calls = 0

    def token_logprobs(self, text, top=0):
        self.calls += 1
        out = self.inner.token_logprobs(text)
        out.logprobs = [-30.0 if v is not None and "NO" in t else
                        -0.5 if v is not None and "YES" in t else v
                        for t, v in zip(out.tokens, out.logprobs, strict=True)]
        return out


def test_a_teacher_that_prefers_one_answer_pulls_the_student_toward_it(tiny_model):
    """Distillation only (the reward's advantage weighs 0): a teacher that prefers YES moves
    the student's YES-over-NO margin up in a few steps, and the step logs the reverse KL."""
    from transformers import AutoTokenizer

    teacher = PrefersYes(tiny_model, AutoTokenizer.from_pretrained(tiny_model))
    s = session(tiny_model, max_steps=3, learning_rate=3e-2, teacher=teacher,  # in memory
                grpo={"distill": {"weight": 1.0, "reward_weight": 0.0, "teacher": "any"}})
    before = yes_margin(s)
    rows = G.train_steps(s, 3)
    after = yes_margin(s)
    assert after > before + 1.0, (before, after)
    assert teacher.calls == 3 * 8  # every rollout of every step, once
    assert all(r["distill_kl"] > 0 and r["teacher_reread"] is False for r in rows)


def test_a_protocol_teacher_scores_the_students_own_tokens(tiny_model):
    """The same weights behind the models protocol (LocalChatModel) give, token for token,
    the log-probs the student's base model gives its rollout; a teacher that splits the
    text elsewhere shares each common run's log-prob among its student tokens."""
    from test_serve_tools import serving
    from transformers import AutoModelForCausalLM

    from workbench.models.base import TokenLogprobs
    from workbench.models.local import LocalChatModel
    from workbench.train.grpo_distill import align_logprobs, protocol_teacher_logps

    s = session(tiny_model)
    teacher = LocalChatModel.wrap(AutoModelForCausalLM.from_pretrained(tiny_model),
                                  s.tokenizer, device="cpu", identity="teacher")
    seq = tokenize_rollout(s.tokenizer, scripted_rollout(), max_length=1024)
    got = protocol_teacher_logps(teacher, s.tokenizer, seq)
    want = G._no_grad_logps(s, [seq], reference=False, base=True)[0]
    assert len(got) == seq.n_policy
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    with serving(teacher, tiny_model) as url:  # a teacher on a server (vLLM's protocol)
        remote = load_model(f"{url}#{tiny_model}", max_retries=0)
        over_http = protocol_teacher_logps(remote, s.tokenizer, seq)
        remote.close()
    assert over_http == pytest.approx(got, abs=1e-6)
    with pytest.raises(WorkbenchError, match="distill.teacher is 'self'"):
        session(tiny_model, teacher=teacher, grpo={"distill": {"weight": 1.0}})
    with pytest.raises(WorkbenchError, match="'fake' does not return token log-probs"):
        session(tiny_model, teacher=load_model("fake"),
                grpo={"distill": {"weight": 1.0, "teacher": "fake"}})

    # student tokens a b c d ef (policy: c, d, ef); teacher tokens ab cd e f: "cd" is
    # shared by two student tokens, "ef" sums two teacher tokens
    starts, mask = [0, 1, 2, 3, 4], [0, 0, 1, 1, 1]
    other = TokenLogprobs(["ab", "cd", "e", "f"], [0, 2, 4, 5], [None, -2.0, -0.5, -0.25])
    assert align_logprobs(starts, mask, 6, other) == [-1.0, -1.0, -0.75]
    with pytest.raises(WorkbenchError, match="no log-prob for a token of the policy"):
        align_logprobs([0, 1], [0, 1], 2, TokenLogprobs(["ab"], [0], [None]))


def test_self_distillation_reads_the_privileged_context(tiny_model):
    """The teacher's prompt is the student's with the privileged context (the task's
    metadata through the template) inserted, every other token the same; its log-probs
    are the base model's on that prompt, and a missing field is one line naming it."""
    from workbench.train.grpo_distill import teacher_sequence

    s = session(tiny_model, grpo={"distill": {"weight": 1.0,
                                              "privileged": "The gold label is {gold}."}})
    r = scripted_rollout({"gold": "YES"})
    seq = tokenize_rollout(s.tokenizer, r, max_length=1024)
    view = teacher_sequence(s.tokenizer, r, seq, "The gold label is YES.")
    a, b = seq.input_ids, view.input_ids
    p = next(i for i in range(len(a)) if a[i] != b[i])
    k = len(b) - len(a)
    assert b[:p] == a[:p] and b[p + k:] == a[p:]  # the context inserted, nothing else
    assert s.tokenizer.decode(b[p:p + k]) == "\n\nThe gold label is YES."
    assert view.mask[p + k:] == seq.mask[p:] and sum(view.mask[:p + k]) == 0
    assert "Is claim 0 true?" in s.tokenizer.decode(a[:p])  # in the task's user turn

    G.step_teacher(s, 0, [[r]], [seq])
    got = seq.teacher_logps
    assert got == pytest.approx(G._no_grad_logps(s, [view], reference=False, base=True)[0])
    plain = G._no_grad_logps(s, [seq], reference=False, base=True)[0]
    assert max(abs(x - y) for x, y in zip(got, plain, strict=True)) > 1e-4
    cut = tokenize_rollout(s.tokenizer, r, max_length=len(a) - 3)  # cut by max_length
    assert teacher_sequence(s.tokenizer, r, cut, "ctx").n_policy == cut.n_policy
    with pytest.raises(WorkbenchError, match=r"train.grpo.distill.privileged: .* task t0"):
        G.step_teacher(s, 0, [[scripted_rollout()]], [seq])


def test_kill_and_resume_with_distillation_is_exact(tiny_model, tmp_path):
    """Self-distillation beside the reward: three steps at once against a kill after step
    2's teacher log-probs were saved, resumed from step 1's checkpoint, which reads them
    back: the same adapter within 1e-6, the same losses."""
    kw = {"agent_setup": free_setup, "reward": text_parity, "save_every": 1, "max_steps": 3,
          "grpo": {"distill": {"weight": 0.5, "privileged": "Hint: {group}."}}}
    whole = session(tiny_model, checkpoint_dir=tmp_path / "whole", **kw)
    rows = G.train_steps(whole, 3)
    assert all("distill_kl" in r for r in rows)
    ck = tmp_path / "ck"

    def boom(stage):
        if stage == "teacher" and killed.step == 1:
            raise RuntimeError("killed")

    killed = session(tiny_model, checkpoint_dir=ck, **kw)
    with pytest.raises(RuntimeError, match="killed"):
        G.train_steps(killed, 3, fault=boom)
    assert (ck / "rollouts" / "step-000002.teacher.jsonl").is_file()
    resumed = session(tiny_model, checkpoint_dir=ck, **kw)
    assert G.restore_checkpoint(resumed).name == "checkpoint-1"
    more = G.train_steps(resumed, 2)
    assert more[0]["teacher_reread"] is True and more[1]["teacher_reread"] is False
    a, b = G.adapter_state(whole), G.adapter_state(resumed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    for x, y in zip(rows, resumed.metrics, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)
        assert x["distill_kl"] == pytest.approx(y["distill_kl"], abs=1e-6)


def test_a_saved_teacher_file_is_read_back_only_under_its_key(tmp_path):
    """The teacher's log-probs of a step are read back exactly under the key they were
    written with (the adapter, the teacher, the settings) and ignored under another."""
    from workbench.train.grpo_distill import read_teacher_file, write_teacher_file

    path = tmp_path / "rollouts" / "step-000001.teacher.jsonl"
    logps = [[-0.1234567890123, -2.5], [], [-1e-9]]
    write_teacher_file(path, 0, "k1", logps)
    assert read_teacher_file(path, "k1", 3) == logps  # exactly: JSON floats round-trip
    assert read_teacher_file(path, "k2", 3) is None
    assert read_teacher_file(path, "k1", 4) is None
    assert read_teacher_file(tmp_path / "none.jsonl", "k1", 3) is None
    assert read_teacher_file(None, "k1", 3) is None
