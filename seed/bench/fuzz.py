"""`python -m seed.bench.fuzz`: a hostile client of the learner, written against protos/seed.proto only.

On a fixed --seed it sends at least --messages hostile messages, each on its own stream (a valid handshake
first where the hostile part is a step), and checks that every one is answered by a gRPC error with the
expected status code whose details name the field, the value received and the value expected:

  handshake.actor_index, handshake.num_envs, handshake.spec   negative / out-of-range / mismatched values
  order.step_before_handshake, order.empty_message, order.second_handshake
  step.observation.shape / .dtype / .data                      wrong and huge shapes (negative dims, 2^62),
                                                               unknown dtypes, byte counts that disagree
  step.reward.nonfinite, step.reward / done / truncated         NaN/inf rewards, wrong tensors
  step.done.bytes / step.truncated.bytes                       bool tensors with bytes other than 0 and 1
  protobuf.garbage                                             bytes that do not parse as an ActorMessage
  oversize                                                     a message beyond the learner's receive limit
  duplicate_actor_index                                        a second stream claims a live actor index:
                                                               the first stream's next step is
                                                               FAILED_PRECONDITION (superseded)
  handshake_deadline (in the background)                       streams that never send anything

and, as load without an error to check: streams opened and abandoned, and clients that never read replies.
The mechanism for known gaps (a case the serving path accepts; listed in the report rather than failed) is
kept for future cases; none is known today.

Keep the claimed actor indices away from honest actors' (--first_actor_index..--num_actors-1): a valid
handshake for an index replaces that actor's run. Writes a JSON report (--out): per category the count,
status codes, an example of the details and every unexpected outcome.

    python -m seed.bench.fuzz --server_address=unix:/tmp/run/learner.sock --num_actors=6 --out=fuzz.json
"""

from __future__ import annotations

import collections
import dataclasses
import json
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
from absl import app, flags

from seed._proto import seed_pb2

STREAM = "/seed.Learner/Stream"
DTYPES = ["float64", "float32", "float16", "int64", "int32", "int8", "uint8", "uint16", "uint64", "bool",
          "complex64", "float128", "object", "<f4", "|u1", "", "garbage", "U10", "datetime64", "void"]
INT32 = (-(2 ** 31), 2 ** 31 - 1)
OK, INVALID, SUPERSEDED, EXHAUSTED, DEADLINE = (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                                                grpc.StatusCode.FAILED_PRECONDITION,
                                                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclasses.dataclass(frozen=True)
class Spec:
    """The env spec the learner expects (what a valid handshake claims)."""

    env: str
    observation_shape: tuple[int, ...]
    observation_dtype: str
    num_actions: int
    action_repeat: int
    frame_stack: int
    envs_per_actor: int


@dataclasses.dataclass
class Case:
    """One stream: valid `preface` messages, then the hostile one, and what the learner must answer."""

    category: str
    preface: list[seed_pb2.ActorMessage]
    hostile: seed_pb2.ActorMessage | bytes
    code: grpc.StatusCode
    must_contain: list[str]  # substrings of the error details: the field, the received and the expected value
    known_gap: str = ""  # non-empty: the serving path accepts this today; the wanted error message


def tensor(array: np.ndarray, dtype: str | None = None, shape: list[int] | None = None,
           data: bytes | None = None) -> seed_pb2.Tensor:
    array = np.ascontiguousarray(array)
    return seed_pb2.Tensor(dtype=array.dtype.name if dtype is None else dtype,
                           shape=list(array.shape) if shape is None else shape,
                           data=array.tobytes() if data is None else data)


class Generator:
    """Draws hostile cases from a seeded random.Random."""

    def __init__(self, spec: Spec, num_actors: int, first_actor_index: int, max_message_bytes: int, seed: int):
        self.spec = spec
        self.num_actors = num_actors
        self.indices = list(range(first_actor_index, num_actors))
        if not self.indices:
            raise ValueError(f"--first_actor_index: got {first_actor_index}, expected < --num_actors ({num_actors})")
        self.max_message_bytes = max_message_bytes
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.k = spec.envs_per_actor

    # ------------------------------------------------------------------------------------------ valid parts

    def run_id(self) -> int:
        return self.rng.getrandbits(62)

    def spec_proto(self, **overrides: Any) -> seed_pb2.EnvSpec:
        s = self.spec
        values = dict(env=s.env, observation_shape=list(s.observation_shape), observation_dtype=s.observation_dtype,
                      num_actions=s.num_actions, action_repeat=s.action_repeat, frame_stack=s.frame_stack)
        values.update(overrides)
        return seed_pb2.EnvSpec(**values)

    def handshake(self, actor_index: int | None = None, num_envs: int | None = None,
                  spec: seed_pb2.EnvSpec | None = None) -> seed_pb2.ActorMessage:
        return seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
            actor_index=self.rng.choice(self.indices) if actor_index is None else actor_index,
            run_id=self.run_id(), num_envs=self.k if num_envs is None else num_envs,
            spec=spec or self.spec_proto()))

    def observation(self) -> np.ndarray:
        return np.zeros((self.k, *self.spec.observation_shape), self.spec.observation_dtype)

    def step(self, **fields: Any) -> seed_pb2.ActorMessage:
        values = dict(observation=tensor(self.observation()), reward=tensor(np.zeros(self.k, np.float32)),
                      done=tensor(np.zeros(self.k, bool)), truncated=tensor(np.zeros(self.k, bool)),
                      actor_send_time=time.time())
        values.update(fields)
        return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(**values))

    # ------------------------------------------------------------------------------------------ categories

    def handshake_actor_index(self) -> Case:
        index = self.rng.choice([-1, -self.rng.randint(2, 10 ** 6), INT32[0], self.num_actors,
                                 self.num_actors + self.rng.randint(1, 10 ** 6), INT32[1]])
        return Case("handshake.actor_index", [], self.handshake(actor_index=index), INVALID,
                    [f"actor_index: got {index}", f"expected 0 <= actor_index < {self.num_actors}"])

    def handshake_num_envs(self) -> Case:
        choices = [0, -1, -self.rng.randint(2, 10 ** 6), INT32[0], INT32[1], self.k + 1,
                   self.k + self.rng.randint(2, 999)]
        if self.k > 1:
            choices.append(self.k - 1)
        n = self.rng.choice(choices)
        return Case("handshake.num_envs", [], self.handshake(num_envs=n), INVALID,
                    [f"num_envs: got {n}", f"expected {self.k}"])

    def handshake_spec(self) -> Case:
        field = self.rng.choice(["env", "observation_shape", "observation_dtype", "num_actions", "action_repeat",
                                 "frame_stack"])
        s = self.spec
        if field == "env":
            value = self.rng.choice(["", "atari:Pong", "gym:CartPole-v0", "fake:" + "x" * self.rng.randint(1, 4096)])
            name = "name"
        elif field == "observation_shape":
            value = self.rng.choice([[], [-1], [2 ** 62], [*s.observation_shape, 1], [0] * self.rng.randint(1, 64)])
            name = "observation_shape"
        elif field == "observation_dtype":
            value = self.rng.choice([d for d in DTYPES if d != s.observation_dtype])
            name = "observation_dtype"
        else:
            current = getattr(s, field)
            value = self.rng.choice([v for v in (0, -1, INT32[0], INT32[1], current + 1) if v != current])
            name = field
        return Case("handshake.spec", [], self.handshake(spec=self.spec_proto(**{field: value})), INVALID,
                    [f"spec.{name}: got", "expected"])

    def step_before_handshake(self) -> Case:
        return Case("order.step_before_handshake", [], self.step(), INVALID,
                    ["first message: got step, expected handshake"])

    def empty_message(self) -> Case:
        return Case("order.empty_message", [], seed_pb2.ActorMessage(), INVALID,
                    ["first message: got an empty ActorMessage, expected handshake"])

    def second_handshake(self) -> Case:
        return Case("order.second_handshake", [self.handshake()], self.handshake(), INVALID,
                    ["message: got handshake, expected step"])

    def observation_shape(self) -> Case:
        expected = [self.k, *self.spec.observation_shape]
        shape = self.rng.choice([
            [], [self.k], [-1, *expected[1:]], [self.k, -(2 ** 40)], [2 ** 62, 2 ** 62], [2 ** 31] * 3,
            [self.k + 1, *expected[1:]], [*expected, 1], [0] * self.rng.randint(1, 100),
            [self.rng.randint(-(2 ** 63), 2 ** 63 - 1) for _ in range(self.rng.randint(1, 8))]])
        if shape == expected:
            shape = [*expected, 2]
        obs = self.observation()
        return Case("step.observation.shape", [self.handshake()], self.step(observation=tensor(obs, shape=shape)),
                    INVALID, ["step.observation.shape: got", f"expected {expected}"])

    def observation_dtype(self) -> Case:
        dtype = self.rng.choice([d for d in DTYPES if d != self.spec.observation_dtype])
        return Case("step.observation.dtype", [self.handshake()],
                    self.step(observation=tensor(self.observation(), dtype=dtype)), INVALID,
                    [f"step.observation.dtype: got {dtype!r}", f"expected {self.spec.observation_dtype!r}"])

    def observation_data(self) -> Case:
        obs = self.observation()
        good = obs.nbytes
        size = self.rng.choice([0, 1, good - 1, good + 1, good * 2, max(0, good - self.rng.randint(1, good)),
                                good + self.rng.randint(1, 4096)])
        data = self.np_rng.bytes(size)
        return Case("step.observation.data", [self.handshake()], self.step(observation=tensor(obs, data=data)),
                    INVALID, [f"step.observation.data: got {size} bytes, expected {good}"])

    def reward_nonfinite(self) -> Case:
        reward = self.np_rng.normal(size=self.k).astype(np.float32)
        positions = self.np_rng.choice(self.k, size=self.rng.randint(1, self.k), replace=False)
        reward[positions] = self.np_rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=len(positions))
        return Case("step.reward.nonfinite", [self.handshake()], self.step(reward=tensor(reward)), INVALID,
                    ["step.reward: got a non-finite value, expected finite"])

    def small_tensor(self) -> Case:
        field = self.rng.choice(["reward", "done", "truncated"])
        dtype = "float32" if field == "reward" else "bool"
        good = np.zeros(self.k, dtype)
        kind = self.rng.choice(["dtype", "shape", "data", "missing"])
        if kind == "dtype":
            value = tensor(good, dtype=self.rng.choice([d for d in DTYPES if d != dtype]))
            expected = [f"step.{field}.dtype: got", f"expected {dtype!r}"]
        elif kind == "shape":
            value = tensor(good, shape=self.rng.choice([[], [self.k + 1], [self.k, 1], [-self.k], [2 ** 62]]))
            expected = [f"step.{field}.shape: got", f"expected [{self.k}]"]
        elif kind == "data":
            size = self.rng.choice([0, good.nbytes + 1, good.nbytes * 4 + 3])
            value = tensor(good, data=b"\x01" * size)
            expected = [f"step.{field}.data: got {size} bytes, expected {good.nbytes}"]
        else:
            value = seed_pb2.Tensor()
            expected = [f"step.{field}.dtype: got ''", f"expected {dtype!r}"]
        return Case(f"step.{field}", [self.handshake()], self.step(**{field: value}), INVALID, expected)

    def bool_bytes(self) -> Case:
        """A bool tensor of the right dtype, shape and size whose bytes are not all 0 or 1 (NumPy reads them as
        True; the learner must refuse them rather than store them)."""
        field = self.rng.choice(["done", "truncated"])
        raw = self.np_rng.integers(0, 2, self.k, dtype=np.uint8)
        index = self.rng.randrange(self.k)
        raw[index] = self.rng.choice([2, 3, 127, 128, 255])
        return Case(f"step.{field}.bytes", [self.handshake()],
                    self.step(**{field: tensor(np.zeros(self.k, bool), data=raw.tobytes())}), INVALID,
                    [f"step.{field}.data: got byte value {raw[index]} at index {index}", "expected 0 or 1"])

    def garbage(self) -> Case:
        # Field 1 (handshake), length-delimited, with a length beyond the end: never parses.
        body = self.np_rng.bytes(self.rng.randint(0, 2000))
        length = len(body) + self.rng.randint(1, 10 ** 6)
        varint = bytearray()
        while True:
            varint.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
            length >>= 7
            if not length:
                break
        data = bytes([0x0A]) + bytes(varint) + body
        preface = [self.handshake()] if self.rng.random() < 0.5 else []
        return Case("protobuf.garbage", preface, data, INVALID,
                    ["bytes that do not parse as a seed.ActorMessage", "expected a serialized ActorMessage"])

    def oversize(self) -> Case:
        size = self.max_message_bytes + self.rng.randint(1, 1 << 20)
        obs = self.observation()
        return Case("oversize", [self.handshake()], self.step(observation=tensor(obs, data=b"\0" * size)), EXHAUSTED,
                    ["larger than max"])

    def finished_stats(self) -> Case:
        """Finished-episode stats the actor could not have produced: each field is checked by the serving path."""
        bad_index = self.rng.choice([-1, self.k, INT32[1]])
        episode = seed_pb2.EpisodeStats(env_index=bad_index, episode_return=float("nan"), raw_return=float("inf"),
                                        steps=-5, frames=-20)
        return Case("step.finished", [self.handshake()], self.step(finished=[episode]), INVALID,
                    [f"step.finished[0].env_index: got {bad_index}, expected 0 <= env_index < {self.k}"])

    def categories(self) -> list[tuple[Callable[[], Case], float]]:
        """(generator, weight)."""
        return [(self.handshake_actor_index, 1), (self.handshake_num_envs, 1), (self.handshake_spec, 1.5),
                (self.step_before_handshake, 0.5), (self.empty_message, 0.5), (self.second_handshake, 0.7),
                (self.observation_shape, 1.5), (self.observation_dtype, 1), (self.observation_data, 1.5),
                (self.reward_nonfinite, 1), (self.small_tensor, 1.5), (self.bool_bytes, 1), (self.garbage, 1)]


# ------------------------------------------------------------------------------------------------ client


def _serialize(message: seed_pb2.ActorMessage | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class Client:
    """Raw streams on one channel: requests are serialized here, so malformed bytes can be sent too."""

    def __init__(self, address: str, auth_token: str = "", timeout_s: float = 15.0):
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                               ("grpc.max_receive_message_length", -1)])
        self.stream = self.channel.stream_stream(STREAM, request_serializer=_serialize,
                                                 response_deserializer=seed_pb2.LearnerMessage.FromString)
        self.metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None
        self.timeout_s = timeout_s

    def run(self, case: Case) -> tuple[grpc.StatusCode, str, int]:
        """Sends the case on a new stream; (status code, details, replies read)."""
        call = self.stream(iter([*case.preface, case.hostile]), metadata=self.metadata, timeout=self.timeout_s)
        replies = 0
        try:
            for _ in call:
                replies += 1
                if case.known_gap and replies > len(case.preface):
                    call.cancel()  # the hostile message was answered: accepted
                    return OK, "accepted (answered with actions)", replies
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and case.known_gap:
                return OK, "accepted (answered with actions)", replies
            return error.code(), error.details() or "", replies
        return OK, "", replies

    def interactive(self) -> tuple[Callable[[Any], None], Any, Callable[[], None]]:
        """(send, responses iterator, close) of a stream driven message by message."""
        outgoing: queue.SimpleQueue = queue.SimpleQueue()

        def requests() -> Iterator:
            while True:
                message = outgoing.get()
                if message is None:
                    return
                yield message

        call = self.stream(requests(), metadata=self.metadata, timeout=self.timeout_s)

        def close() -> None:
            outgoing.put(None)
            call.cancel()

        return outgoing.put, call, close

    def close(self) -> None:
        self.channel.close()


@dataclasses.dataclass
class Outcome:
    category: str
    code: str
    details: str
    expected: bool
    known_gap: str = ""


def check(case: Case, code: grpc.StatusCode, details: str) -> bool:
    return code == case.code and all(text in details for text in case.must_contain)


class Fuzzer:
    def __init__(self, client: Client, generator: Generator, rate_per_s: float):
        self.client = client
        self.gen = generator
        self.rate_per_s = rate_per_s
        self.outcomes: list[Outcome] = []
        self.load: collections.Counter = collections.Counter()  # streams without an error to check
        self._lock = threading.Lock()

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def run_case(self, case: Case) -> None:
        code, details, _ = self.client.run(case)
        if case.known_gap:
            self.record(Outcome(case.category, code.name, details[:300], check(case, code, details), case.known_gap))
        else:
            self.record(Outcome(case.category, code.name, details[:300], check(case, code, details)))

    def duplicate_actor_index(self) -> None:
        """Stream A handshakes as actor i and steps; stream B claims i; A's next step must be FAILED_PRECONDITION
        (superseded: a live actor told to exit rather than reconnect)."""
        index = self.gen.rng.choice(self.gen.indices)
        send_a, replies_a, close_a = self.client.interactive()
        send_b, replies_b, close_b = self.client.interactive()
        try:
            send_a(self.gen.handshake(actor_index=index))
            next(replies_a)
            send_a(self.gen.step())
            next(replies_a)
            send_b(self.gen.handshake(actor_index=index))
            next(replies_b)
            send_a(self.gen.step())
            try:
                next(replies_a)
                code, details = OK, "the stale stream's step was answered"
            except grpc.RpcError as error:
                code, details = error.code(), error.details() or ""
        except (grpc.RpcError, StopIteration) as error:
            code, details = grpc.StatusCode.UNKNOWN, f"setup failed: {error!r}"
        finally:
            close_a()
            close_b()
        self.record(Outcome("duplicate_actor_index", code.name, details[:300],
                            code == SUPERSEDED and f"actor_index {index}" in details and "superseded" in details))

    def abandoned(self) -> None:
        """Opens a stream, maybe sends a handshake, and walks away without closing it cleanly."""
        send, _, close = self.client.interactive()
        if self.gen.rng.random() < 0.5:
            send(self.gen.handshake())
        time.sleep(self.gen.rng.random() * 0.02)
        close()
        self.load["abandoned"] += 1

    def never_read(self) -> None:
        """Handshakes and sends steps without reading a single reply, then drops the stream."""
        send, _, close = self.client.interactive()
        send(self.gen.handshake())
        for _ in range(self.gen.rng.randint(5, 40)):
            send(self.gen.step())
        time.sleep(0.05)
        close()
        self.load["never_read"] += 1

    def silent(self, results: list) -> None:
        """A stream that never sends: the learner must end it (handshake deadline)."""
        send, replies, close = self.client.interactive()
        try:
            next(replies)
            results.append((OK, "answered without a handshake"))
        except grpc.RpcError as error:
            results.append((error.code(), error.details() or ""))
        finally:
            close()

    def run(self, messages: int, oversize: int, finished_stats: int) -> float:
        """Sends `messages` hostile messages (plus the special categories); returns the seconds it took."""
        start = time.monotonic()
        silent: list = []
        silent_threads = [threading.Thread(target=self.silent, args=(silent,), daemon=True) for _ in range(2)]
        for thread in silent_threads:
            thread.start()
        generators, weights = zip(*self.gen.categories(), strict=True)
        extras = (["oversize"] * oversize + ["duplicate"] * max(1, messages // 50) + ["finished"] * finished_stats
                  + ["abandoned"] * max(1, messages // 25) + ["never_read"] * max(1, messages // 100))
        plan = [None] * messages + extras
        self.gen.rng.shuffle(plan)
        for i, item in enumerate(plan):
            due = start + i / self.rate_per_s
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if item is None:
                self.run_case(self.gen.rng.choices(generators, weights)[0]())
            elif item == "oversize":
                self.run_case(self.gen.oversize())
            elif item == "duplicate":
                self.duplicate_actor_index()
            elif item == "finished":
                self.run_case(self.gen.finished_stats())
            elif item == "abandoned":
                self.abandoned()
            else:
                self.never_read()
        for thread in silent_threads:
            thread.join(timeout=60)
        for code, details in silent:
            self.record(Outcome("handshake_deadline", code.name, details[:300],
                                code == DEADLINE and "handshake: got no message within" in details))
        return time.monotonic() - start


def summarize(outcomes: list[Outcome], load: dict[str, int], seconds: float, seed: int) -> dict[str, Any]:
    categories: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        entry = categories.setdefault(outcome.category, {"count": 0, "codes": collections.Counter(), "example": "",
                                                         "unexpected": [], "unexpected_count": 0})
        entry["count"] += 1
        entry["codes"][outcome.code] += 1
        if not entry["example"] and outcome.expected:
            entry["example"] = outcome.details
        if not outcome.expected:
            entry["unexpected_count"] += 1
            if len(entry["unexpected"]) < 5:
                entry["unexpected"].append(f"{outcome.code}: {outcome.details}")
        if outcome.known_gap:
            entry["known_gap_wanted"] = outcome.known_gap
    for entry in categories.values():
        entry["codes"] = dict(entry["codes"])
    checked = [o for o in outcomes if not o.known_gap]
    return {
        "seed": seed, "seconds": round(seconds, 1),
        "hostile_messages": len(checked),
        "unexpected": sum(not o.expected for o in checked),
        "known_gaps": {c: e for c, e in categories.items() if "known_gap_wanted" in e},
        "load_streams": dict(load),
        "categories": {c: e for c, e in sorted(categories.items()) if "known_gap_wanted" not in e},
    }


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("server_address", "localhost:8686", "The learner: host:port or unix:/path.")
    flags.DEFINE_string("auth_token", "", "The learner's --auth_token, if it has one.")
    flags.DEFINE_string("env", "gym:CartPole-v1", "The learner's --env (valid handshakes claim its spec).")
    flags.DEFINE_integer("envs_per_actor", 4, "The learner's --envs_per_actor.")
    flags.DEFINE_integer("num_actors", 6, "The learner's --num_actors.")
    flags.DEFINE_integer("first_actor_index", 2, "Claim only actor indices in [this, --num_actors) in valid "
                                                 "handshakes (keep honest actors below it).")
    flags.DEFINE_integer("messages", 1000, "Hostile messages with an error to check (more are sent for load).")
    flags.DEFINE_integer("oversize", 3, "Messages beyond the receive limit (each is --max_message_bytes large).")
    flags.DEFINE_integer("finished_stats", 10, "Messages with impossible finished-episode stats (beside the "
                                               "categories drawn at random).")
    flags.DEFINE_integer("max_message_bytes", 64 << 20, "The learner's receive limit in bytes.")
    flags.DEFINE_float("rate", 50.0, "Streams per second.")
    flags.DEFINE_integer("seed", 0, "Random seed of the whole run.")
    flags.DEFINE_string("out", "fuzz.json", "The JSON report.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from seed.envs import make_spec  # the spec only; nothing of the actor

    env_spec = make_spec(FLAGS.env)
    spec = Spec(FLAGS.env, tuple(env_spec.observation_shape), env_spec.observation_dtype, env_spec.num_actions,
                env_spec.action_repeat, env_spec.frame_stack, FLAGS.envs_per_actor)
    try:
        generator = Generator(spec, FLAGS.num_actors, FLAGS.first_actor_index, FLAGS.max_message_bytes, FLAGS.seed)
    except ValueError as error:
        print(f"seed.bench.fuzz: {error}", file=sys.stderr)
        sys.exit(2)
    client = Client(FLAGS.server_address, FLAGS.auth_token)
    fuzzer = Fuzzer(client, generator, FLAGS.rate)
    seconds = fuzzer.run(FLAGS.messages, FLAGS.oversize, FLAGS.finished_stats)
    client.close()
    report = summarize(fuzzer.outcomes, fuzzer.load, seconds, FLAGS.seed)
    with open(FLAGS.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"[fuzz] {report['hostile_messages']} hostile messages in {report['seconds']}s, "
          f"{report['unexpected']} unexpected outcomes, known gaps: {sorted(report['known_gaps'])} -> {FLAGS.out}",
          flush=True)
    sys.exit(0 if report["unexpected"] == 0 else 1)


def run() -> None:
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
