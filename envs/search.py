"""`search`: a Search-R1-like multi-hop retrieval benchmark over a generated corpus.

Algorithm:
1. From the seed, generate a world of unique made-up entities (countries, cities, companies,
   people) and functional relations between them (born_in, works_for, headquartered_in,
   founded_by, in_country, mayor_of, capital); every relation has exactly one value, so every
   chained question has exactly one answer.
2. Write one short document per entity stating its relations in plain sentences (a few
   thousand documents) and index them with BM25 (`bm25s`), once per seed.
3. A question of h hops (h = 1..4, level = h - 1) is a random relation walk from a start entity,
   phrased as nested noun phrases: "What is the capital of the country the city where X was
   born is in?". Answering needs one search per hop.
4. Tool `search(query, k)` returns the top-k documents; the answer goes in
   `<answer>...</answer>`; reward is exact match after SQuAD-style normalisation (lowercase, no
   punctuation, no articles, single spaces) against any accepted answer.

Tasks can also come from a verl-schema file (`data_path`, see envs/datasets.py), e.g. Search-R1
rows; they are searched against the same generated corpus unless `corpus_path` (jsonl with
"title" and "text") is given.

Invariants (tests/envs/test_envs_search.py): same seed -> byte-identical tasks and corpus; the
oracle agent scores 1 and the wrong agent 0 on every sampled task; malformed calls give failure
results.
"""

from __future__ import annotations

import json
import random
import re
import string
import threading
from dataclasses import dataclass

import bm25s
from tqdm.std import tqdm

from envs.base import Episode, Task, ToolCall, ToolCallError, ToolResult, dispatch, failure, system_prompt, tool_schema
from envs.datasets import load_verl_tasks
from envs.toolcalls import format_tool_call

# bm25s wraps its loops in tqdm even with progress off, and tqdm's first bar makes a multiprocessing
# lock: a POSIX semaphore that a rank (which ends with os._exit, as multiprocessing children do) never
# frees, so the resource tracker warned of a leaked semaphore after every search run. A thread lock
# serves here: nothing prints bars from several processes.
tqdm.set_lock(threading.RLock())

_SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "sel", "dun", "bri", "mar", "qu", "zen", "fal", "nor", "el", "is", "an", "gor", "thu", "vel", "pri", "os", "ul", "dra")
# (relation, subject type, object type, question phrase of the object, document sentence)
_RELATIONS = (
    ("born_in", "person", "city", "the city where {x} was born", "{s} was born in {o}."),
    ("works_for", "person", "company", "the company {x} works for", "{s} works for {o}."),
    ("headquartered_in", "company", "city", "the city where {x} is headquartered", "{s} is headquartered in {o}."),
    ("founded_by", "company", "person", "the founder of {x}", "{s} was founded by {o}."),
    ("in_country", "city", "country", "the country {x} is in", "{s} is a city in {o}."),
    ("mayor", "city", "person", "the mayor of {x}", "The mayor of {s} is {o}."),
    ("capital", "country", "city", "the capital of {x}", "The capital of {s} is {o}."),
)
_KIND_WORDS = {"person": "a person", "city": "a city", "company": "a company", "country": "a country"}
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    num_countries: int = 40  # entities of each kind; documents = their sum
    num_cities: int = 400
    num_companies: int = 400
    num_people: int = 1600
    max_hops: int = 4  # questions have 1..max_hops hops (level = hops - 1)
    default_k: int = 3  # documents returned when the call omits k
    max_k: int = 10  # largest k a call may ask for
    num_tasks: int = 200  # generated tasks when the caller does not say

    def __post_init__(self):
        for name in ("num_countries", "num_cities", "num_companies", "num_people", "max_hops", "default_k", "max_k", "num_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"SearchConfig.{name}={getattr(self, name)} must be >= 1; pass a positive count.")
        if self.default_k > self.max_k:
            raise ValueError(f"SearchConfig.default_k={self.default_k} exceeds max_k={self.max_k}; lower default_k or raise max_k.")
        if self.max_hops > 4:
            raise ValueError(f"SearchConfig.max_hops={self.max_hops} must be <= 4 (questions get unreadable beyond); lower it.")


def normalize_answer(text: str) -> str:
    """SQuAD/Search-R1 normalisation: lowercase, drop punctuation and articles, squeeze spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def extract_answer(text: str) -> str | None:
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


# ---- the generated world -------------------------------------------------------------------


class World:
    """Entities, relations and one document per entity, all a pure function of (cfg, seed)."""

    def __init__(self, cfg: SearchConfig, seed: int):
        rng = random.Random(f"search-world-{seed}")
        used: set[str] = set()
        counts = {"country": cfg.num_countries, "city": cfg.num_cities, "company": cfg.num_companies, "person": cfg.num_people}
        self.kinds: dict[str, list[str]] = {k: [self._name(rng, k, used) for _ in range(n)] for k, n in counts.items()}
        self.kind_of = {e: k for k, names in self.kinds.items() for e in names}
        self.rel: dict[tuple[str, str], str] = {}
        for name, subj, obj, _, _ in _RELATIONS:
            for s in self.kinds[subj]:
                candidates = [o for o in self.kinds[obj] if o != s]
                self.rel[(name, s)] = rng.choice(candidates)
        self.docs = [self._doc(e) for k in ("country", "city", "company", "person") for e in self.kinds[k]]

    @staticmethod
    def _name(rng: random.Random, kind: str, used: set[str]) -> str:
        while True:
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
            name = f"{word} {''.join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize()}" if kind in ("person", "company") else word
            if kind == "company":
                name += rng.choice((" Corp", " Labs", " Works", " Group"))
            if name not in used:
                used.add(name)
                return name

    def _doc(self, entity: str) -> dict:
        kind = self.kind_of[entity]
        facts = [f"{entity} is {_KIND_WORDS[kind]}."]
        facts += [sent.format(s=entity, o=self.rel[(r, entity)]) for r, subj, _, _, sent in _RELATIONS if subj == kind]
        return {"title": entity, "text": " ".join(facts)}

    def question(self, rng: random.Random, hops: int) -> tuple[str, list[str], str]:
        """(question, entities visited from the start to the answer, answer) of a `hops` walk."""
        start = rng.choice(self.kinds[rng.choice(("person", "company", "city", "country"))])
        path, phrase, cur = [start], start, start
        for _ in range(hops):
            options = [r for r in _RELATIONS if r[1] == self.kind_of[cur]]
            name, _, _, template, _ = rng.choice(options)
            cur = self.rel[(name, cur)]
            phrase = template.format(x=phrase)
            path.append(cur)
        who = "Who" if self.kind_of[cur] == "person" else "What"
        return f"{who} is {phrase}?", path, cur


_world_cache: dict[tuple, tuple[World, object]] = {}


def _world_and_index(cfg: SearchConfig, seed: int, corpus_path: str | None) -> tuple[World, list[dict], object]:
    key = (cfg, seed, corpus_path)
    if key not in _world_cache:
        world = World(cfg, seed)
        docs = world.docs if corpus_path is None else _load_corpus(corpus_path)
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([f"{d['title']} {d['text']}" for d in docs], show_progress=False), show_progress=False)
        _world_cache[key] = (world, docs, retriever)
    return _world_cache[key]


def _load_corpus(path: str) -> list[dict]:
    docs = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                row = json.loads(line)
                if "text" not in row:
                    raise ValueError(f"{path}: corpus row {i} has no 'text' field; each line needs {{\"title\", \"text\"}}.")
                docs.append({"title": str(row.get("title", "")), "text": str(row["text"])})
    return docs


# ---- the env -------------------------------------------------------------------------------

SEARCH_TOOL = tool_schema(
    "search", "Search the document collection with BM25; returns the top-k documents.",
    {"query": ("string", "keywords or a question"), "k": ("integer", "number of documents to return (1-10, default 3)")},
    required=["query"],
)
SYSTEM = system_prompt(
    "Answer the question. You can search a document collection with the tool `search`; questions may need several searches, one per fact.",
    format_tool_call("search", {"query": "Kalo Venmar", "k": 3}),
    "write the answer (just the name) inside <answer>...</answer>.",
)


class SearchEpisode:
    def __init__(self, env: SearchEnv, task: Task):
        self.env, self.task = env, task

    def _search(self, query: str, k: int | None = None) -> ToolResult:
        k = self.env.cfg.default_k if k is None else k
        if not 1 <= k <= self.env.cfg.max_k:
            return failure("search", f"k={k} must be between 1 and {self.env.cfg.max_k}")
        # Words the corpus never uses carry no BM25 weight; dropping them keeps bm25s from raising.
        words = [w for w in bm25s.tokenize([query], return_ids=False, show_progress=False)[0] if w in self.env.retriever.vocab_dict]
        if not words:
            return ToolResult(tool="search", text="No documents match the query.", status="success")
        docs, scores = self.env.retriever.retrieve([words], k=min(k, len(self.env.docs)), show_progress=False)
        lines = [f"[{i + 1}] {self.env.docs[int(d)]['title']}: {self.env.docs[int(d)]['text']}"
                 for i, (d, s) in enumerate(zip(docs[0], scores[0])) if s > 0]
        return ToolResult(tool="search", text="\n".join(lines) or "No documents match the query.", status="success")

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        return dispatch(call, self.task.tools, {"search": self._search})

    def score(self, final_text: str) -> float:
        pred = extract_answer(final_text)
        if pred is None:
            return 0.0
        accepted = {normalize_answer(a) for a in _accepted(self.task.answer)}
        return 1.0 if normalize_answer(pred) in accepted else 0.0

    def close(self) -> None:
        pass


def _accepted(answer) -> list[str]:
    """Accepted answers from our tasks ({"answer"}) or Search-R1 rows (str, list, {"target": [...]})."""
    if isinstance(answer, dict):
        answer = answer.get("answer", answer.get("target", []))
    if isinstance(answer, str):
        return [answer]
    return [str(a) for a in answer]


class SearchEnv:
    name = "search"

    def __init__(self, *, seed: int = 0, num_tasks: int | None = None, data_path: str | None = None,
                 level: int | None = None, corpus_path: str | None = None, cfg: SearchConfig = SearchConfig()):
        if level is not None and not 0 <= level < cfg.max_hops:
            raise ValueError(f"search: level={level} must be in [0, {cfg.max_hops - 1}] (level = hops - 1); pick one of those or None.")
        self.cfg, self.seed, self.level = cfg, seed, level
        self.world, self.docs, self.retriever = _world_and_index(cfg, seed, corpus_path)
        if data_path is not None:
            self._tasks = load_verl_tasks(data_path, bench="search", tools=(SEARCH_TOOL,), system=SYSTEM)[:num_tasks]
        else:
            self._tasks = self._generate(cfg.num_tasks if num_tasks is None else num_tasks)

    def _generate(self, num_tasks: int) -> list[Task]:
        rng = random.Random(f"search-tasks-{self.seed}")
        tasks = []
        for i in range(num_tasks):
            hops = self.level + 1 if self.level is not None else 1 + i % self.cfg.max_hops
            question, path, answer = self.world.question(rng, hops)
            tasks.append(Task(
                task_id=f"search-{self.seed}-{i}", bench="search", level=hops - 1,
                messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": question}),
                tools=(SEARCH_TOOL,), answer={"answer": answer, "path": path}, meta={"hops": hops},
            ))
        return tasks

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> Episode:
        return SearchEpisode(self, task)

    def close(self) -> None:
        pass


def _call(query: str, k: int = 3) -> str:
    return format_tool_call("search", {"query": query, "k": k})


def oracle_actions(task: Task) -> list[str]:
    """Search each entity on the path (the oracle knows it), then answer."""
    answer = _accepted(task.answer)[0]
    path = task.answer.get("path", [answer]) if isinstance(task.answer, dict) else [answer]
    searches = [f"I need the facts about {e}.\n{_call(e)}" for e in path[:-1]] or [f"Let me check.\n{_call(answer)}"]
    return [*searches, f"<answer>{answer}</answer>"]


def wrong_actions(task: Task) -> list[str]:
    """One search, then an answer that is never accepted."""
    return [f"Searching.\n{_call(task.messages[-1]['content'])}", "<answer>no idea</answer>"]
