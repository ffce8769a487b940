"""Scripted teachers for distillation tests: deterministic replies keyed on the prompt, sent
through the real `fake` backend (same protocol, registry and cache as real models)."""

import hashlib
import re


def _h(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16)


def _text(user: str) -> str:
    m = re.search(r"Text:\n(.*?)\n\n(?:Write|Question)", user, re.S)
    return m.group(1) if m else ""


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=\.)\s+", text) if len(s.strip()) > 30]


def _options(user: str) -> list[str]:
    return re.findall(r"^[A-D]\) (.+)$", user, re.M)


def reply(conv) -> str:
    user = conv[-1]["content"]
    text = _text(user)
    sents = _sentences(text) or ["The text is short and has no full sentence to quote."]
    focus = re.search(r"about (.+?) (?:that this text|\(|in this)", user)
    topic = focus.group(1) if focus else "it"
    key = sents[_h(user) % len(sents)]
    word = (re.findall(r"[A-Za-z]{6,}", key) or ["signal"])[0].lower()
    if "Write one multiple-choice question" in user:
        wrong = [f"A {w} figure that no sentence here states" for w in ("first", "second",
                                                                        "third")]
        opts = [key[:120]] + wrong
        k = _h(key) % 4
        opts[0], opts[k] = opts[k], opts[0]
        return (f"Question: Regarding {topic}, which statement about {word} is true?\n"
                + "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(opts))
                + f"\nCorrect: {'ABCD'[k]}")
    if "Write one open-ended question" in user:
        return f"Question: How does {word} relate to {topic}?"
    if "Think step by step inside <think>" in user:
        opts = _options(user)
        if opts:
            best = next((i for i, o in enumerate(opts) if o in text), 0)
            return (f"<think>First, recall what is said about {word}. Then compare each "
                    f"option with it. Therefore option {'ABCD'[best]} fits.</think>\n"
                    f"Option {'ABCD'[best]} restates the fact.\n<answer>{'ABCD'[best]}</answer>")
        return (f"<think>First, find {word}. Then connect it to the question.</think>\n"
                f"{key}\n<answer>{key[:80]}</answer>")
    if "that this fact answers" in user:
        fact = user.split("Fact: ", 1)[1].split("\n", 1)[0]
        w = (re.findall(r"[A-Za-z]{6,}", fact) or ["signal"])
        start = re.search(r'Start the question with "(\w+)"', user)
        if start and start.group(1) != "What":
            return f"{start.group(1)} does {w[0].lower()} matter for {w[-1].lower()}?"
        return f"What is true of {w[0].lower()} and {w[-1].lower()}?"
    if "that this text answers" in user:
        # a teacher that asks about two words of one sentence (not about the prompt's focus,
        # which the quality gates would refuse as words the text never uses)
        other = [w.lower() for w in re.findall(r"[A-Za-z]{6,}", key) if w.lower() != word]
        return f"What is the role of {word} in {other[-1] if other else 'practice'}?"
    if "Answer in one sentence" in user:
        q = user.split("Question: ", 1)[-1]
        return sents[_h(q) % len(sents)]
    if "Explain step by step" in user:
        return (f"First, the text discusses {word}. Then it states the key fact. "
                "Therefore the given answer follows from the text.")
    if "Answer with the letter" in user:
        opts = _options(user)
        best = next((i for i, o in enumerate(opts) if o in text), 0)
        return "ABCD"[best]
    if "strict JSON" in user:
        return '{"question": "q?", "thinking": "t", "solution": "s", "answer": "A"}'
    return "I do not know."


def garbage(conv) -> str:
    return ["", "lorem ipsum", "A) B) C)", "<think>unclosed", "Question: What?"][
        _h(conv[-1]["content"]) % 5]


def slow(conv) -> str:
    import time

    time.sleep(0.5)
    return reply(conv)


_asked: set[str] = set()


def flaky_reply(conv) -> str:
    """`reply`, except that the first request for each fact's question gets chatter with no
    question in it (the retry of `write_attempts` asks again)."""
    user = conv[-1]["content"]
    if "that this fact answers" in user and user not in _asked:
        _asked.add(user)
        return "Sure, here is one"
    return reply(conv)


# --- a teacher for the quality gates: one question per sentence of three sections ------------

# (section, sentence, the question the teacher writes for it, the gate that must remove it:
# None for a good question; "strip" for one that is kept once its echoed prefix is gone)
GATED = [
    ("bjt", "A bipolar junction transistor amplifies a small base current into a much larger "
     "collector current.", "What is the biological basis of a bipolar transistor?",
     "foreign_words"),
    ("bjt", "The collector current equals the current gain beta times the base current in the "
     "active region.", "How does the collector current depend on the base current?", None),
    ("bjt", "Silicon transistors need about 0.7 volts between base and emitter before they "
     "conduct.", "Q: Q: Q: What voltage must a silicon transistor see between base and "
     "emitter before it conducts?", "strip"),
    ("bjt", "The emitter is heavily doped so that it injects many carriers into the base.",
     "The emitter is heavily doped to inject carriers into the base?", "interrogative"),
    ("bjt", "A common-emitter amplifier inverts the signal and offers a high voltage gain.",
     "Why does a common-emitter amplifier invert the signal?", None),
    ("diff", "The diff program compares two files line by line and prints the lines that "
     "differ.", "How does Nginx compare two files line by line?", "named_entities"),
    ("diff", "The unified format shows a few lines of context around each change.",
     "What does the unified format show around each change?", None),
    ("diff", "The --ignore-case option makes diff treat upper and lower case letters as the "
     "same.", "What does the --ignore-case option make diff do?", None),
    ("diff", "The --ignore-all-space option makes diff ignore white space when it compares "
     "lines.", "Diff ignores white space with the --ignore-all-space option?", "interrogative"),
    ("diff", "The cmp program reports the first byte at which two binary files differ.",
     "Why does cmp stop after 512 bytes of two binary files?", "named_entities"),
    ("patch", "Patch reads the current directory and applies the changes that a diff file "
     "describes.", "How does a transistor amplify the base current?", "content_words"),
    ("patch", "A patch file made by diff -u carries enough context for patch to find moved "
     "lines.", "Why does a patch file made by diff -u carry enough context?", None),
    ("patch", "The -R option reverses a patch that has already been applied to the files.",
     "What does the -R option of patch do?", None),
    ("patch", "Backup files keep the original contents when patch changes a file in place.",
     "Which files keep the original contents when patch changes a file?", None),
    ("patch", "Rejected hunks are written to a file ending in .rej next to the original "
     "file.", "Text: Which file receives the rejected hunks of a patch?", "echo_prefix"),
]


def gated_reply(conv) -> str:
    """`reply`, except that the question for each sentence of GATED is the one listed."""
    user = conv[-1]["content"]
    if "that this fact answers" in user:
        fact = user.split("Fact: ", 1)[1].split("\n", 1)[0]
        for _, sentence, question, _ in GATED:
            if sentence == fact:
                return question
    return reply(conv)
