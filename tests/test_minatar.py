"""`--env=minatar:<game>`: the spec, the games against MinAtar's own wrapper, seeding, the MinAtar networks, and every
agent training on minatar:breakout through real learner and actor processes."""

from __future__ import annotations

import math
import signal

import numpy as np
import pytest
import torch

import seed.envs as envs
from seed.agents.torsos import MinAtarTorso
from seed.envs import minatar as family
from tests.conftest import read_metrics, wait_for

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def _needs_minatar():
    return pytest.importorskip("minatar", reason="the minatar package is not installed: pip install minatar")


def _frames(batch, steps: int, seed: int = 0) -> list[np.ndarray]:
    """The batch's observations over `steps` steps of uniformly random actions drawn with `seed`."""
    rng = np.random.default_rng(seed)
    frames = [batch.reset()]
    for _ in range(steps):
        frames.append(batch.step(rng.integers(0, batch.spec.num_actions, batch.num_envs)).observation)
    return frames


# ----------------------------------------------------------------------------------------------- spec


@pytest.mark.parametrize("game, channels", [("breakout", 4), ("asterix", 4), ("freeway", 7), ("seaquest", 10),
                                            ("space_invaders", 6)])
def test_spec_shapes_channels_and_actions(game, channels):
    spec = envs.make_spec(f"minatar:{game}")
    assert spec.name == f"minatar:{game}"
    assert spec.observation_shape == (10, 10, channels)
    assert spec.observation_dtype == "bool"
    assert spec.num_actions == 6
    assert spec.action_repeat == 1 and spec.frame_stack == 1


def test_minimal_action_sets_and_option_errors():
    sizes = {game: envs.make_spec(f"minatar:{game}", {"minatar_minimal_action_set": True}).num_actions
             for game in GAMES}
    assert sizes == {"asterix": 5, "breakout": 3, "freeway": 3, "seaquest": 6, "space_invaders": 4}
    with pytest.raises(ValueError, match=r"action_repeat: got 4, expected 1"):
        envs.make_spec("minatar:breakout", {"action_repeat": 4})
    with pytest.raises(ValueError, match=r"minatar_sticky_actions: got 1.5, expected a probability in \[0, 1\]"):
        envs.make_batch("minatar:breakout", 1, 0, {"minatar_sticky_actions": 1.5})
    with pytest.raises(ValueError, match=r"minatar_difficulty_ramping: got 'maybe', expected a boolean"):
        envs.make_batch("minatar:breakout", 1, 0, {"minatar_difficulty_ramping": "maybe"})


def test_unknown_game_names_the_five_games():
    for make in (lambda: envs.make_spec("minatar:pong"), lambda: envs.make_batch("minatar:Breakout", 1, 0, {})):
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value)
        assert "unknown game" in message and "expected one of" in message
        assert all(game in message for game in GAMES), message
    with pytest.raises(ValueError, match=r"FAMILY one of .*minatar"):
        envs.make_spec("minatr:breakout")


def test_channel_and_action_tables_match_the_package():
    minatar = _needs_minatar()
    for game in GAMES:
        reference = minatar.Environment(game)
        assert tuple(reference.state_shape()) == (10, 10, family.CHANNELS[game]), game
        assert tuple(reference.minimal_action_set()) == family.MINIMAL_ACTIONS[game], game
        assert reference.num_actions() == family.FULL_ACTION_SET_SIZE


# ----------------------------------------------------------------------------------------------- the games


# (our options, minatar.Environment's keyword arguments): MinAtar's defaults, then both turned off.
SETTINGS = [({}, {}), ({"minatar_sticky_actions": 0.0, "minatar_difficulty_ramping": False},
                       {"sticky_action_prob": 0.0, "difficulty_ramping": False})]


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("options, reference_kwargs", SETTINGS, ids=["defaults", "off"])
def test_env_plays_like_minatars_own_wrapper(game, options, reference_kwargs):
    """make_batch with no options = minatar.Environment(game) with its defaults (sticky actions 0.1, difficulty
    ramping), seeded with seed + env id; and with both off = the wrapper with both off: equal states, rewards and
    episode ends over 1,500 random steps."""
    minatar = _needs_minatar()
    batch = envs.make_batch(f"minatar:{game}", 1, 4, {"seed": 10, **options})
    reference = minatar.Environment(game, **reference_kwargs)
    reference.seed(14)
    reference.reset()
    np.testing.assert_array_equal(batch.reset()[0], reference.state())
    rng = np.random.default_rng(1)
    episodes = 0
    for _ in range(1_500):
        action = int(rng.integers(0, 6))
        step = batch.step(np.array([action]))
        reward, terminal = reference.act(action)
        assert step.reward[0] == reward and step.done[0] == terminal and not step.truncated[0]
        if terminal:
            episodes += 1
            reference.reset()
        np.testing.assert_array_equal(step.observation[0], reference.state())
    if game != "freeway":  # one Freeway episode lasts 2,500 steps
        assert episodes >= 2


def test_sticky_actions_and_ramping_defaults():
    _needs_minatar()
    env = envs.make_batch("minatar:asterix", 1, 0, {}).envs[0]
    assert env.sticky_actions == 0.1 and env._game.ramping is True
    off = envs.make_batch("minatar:asterix", 1, 0, {"minatar_sticky_actions": 0.0,
                                                    "minatar_difficulty_ramping": False}).envs[0]
    assert off.sticky_actions == 0.0 and off._game.ramping is False
    # The option changes play: the same seed and actions give other frames without sticky actions.
    sticky = _frames(envs.make_batch("minatar:breakout", 1, 0, {"seed": 2}), 200)
    plain = _frames(envs.make_batch("minatar:breakout", 1, 0, {"seed": 2, "minatar_sticky_actions": 0.0}), 200)
    assert not all(np.array_equal(a, b) for a, b in zip(sticky, plain, strict=True))


def test_same_seed_same_frames_and_env_i_uses_seed_plus_env_id():
    _needs_minatar()
    first = _frames(envs.make_batch("minatar:space_invaders", 3, 0, {"seed": 5}), 300)
    again = _frames(envs.make_batch("minatar:space_invaders", 3, 0, {"seed": 5}), 300)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert first[0].shape == (3, 10, 10, 6) and first[0].dtype == bool
    other = _frames(envs.make_batch("minatar:space_invaders", 3, 0, {"seed": 6}), 300)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    # Env 2 of a batch starting at env id 0 = env 0 of a batch starting at env id 2 (both seeded 5 + 2), given the
    # same actions: replay env 2's actions alone.
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 6, 3) for _ in range(300)]
    single = envs.make_batch("minatar:space_invaders", 1, 2, {"seed": 5})
    frames = [single.reset()] + [single.step(a[2:]).observation for a in actions]
    assert all(np.array_equal(f[0], g[2]) for f, g in zip(frames, first, strict=True))


def test_episode_end_reports_the_return_and_the_next_episodes_first_state():
    _needs_minatar()
    batch = envs.make_batch("minatar:breakout", 1, 0, {"seed": 0, "minatar_sticky_actions": 0.0})
    batch.reset()
    total, steps = 0.0, 0
    while True:
        step = batch.step(np.array([0]))
        total += float(step.reward[0])
        steps += 1
        if step.done[0]:
            break
    [stats] = step.finished
    assert stats.episode_return == total and stats.steps == stats.frames == steps
    ball = step.observation[0, :, :, 1]
    assert ball.sum() == 1 and np.flatnonzero(ball.any(1))[0] == 3  # a new ball, launched from row 3
    assert step.observation[0, 1:4, :, 3].all()  # and three full rows of bricks


def test_render_rgb_colours_each_cell_by_its_highest_channel():
    """A hand-made Seaquest state (10 channels): cell (0, 0) holds channels 0 and 2, cell (4, 7) channel 9, cell
    (9, 9) channels 1, 5 and 3; the rest is empty. Each cell is 16 x 16 pixels of its highest channel's colour."""
    _needs_minatar()
    env = envs.make_batch("minatar:seaquest", 1, 0, {}).envs[0]
    assert env.render_rgb().shape == (160, 160, 3)  # the real first state
    state = np.zeros((10, 10, 10), bool)
    state[0, 0, [0, 2]] = True
    state[4, 7, 9] = True
    state[9, 9, [1, 5, 3]] = True
    env._state = lambda: state
    image = env.render_rgb()
    assert image.shape == (160, 160, 3) and image.dtype == np.uint8

    def cell(row, column):
        block = image[row * 16:(row + 1) * 16, column * 16:(column + 1) * 16].reshape(-1, 3)
        assert (block == block[0]).all()
        return tuple(int(v) for v in block[0])

    palette = [tuple(int(v) for v in colour) for colour in family.PALETTE]
    assert (cell(0, 0), cell(4, 7), cell(9, 9)) == (palette[2], palette[9], palette[5])
    assert int(image.sum()) == 256 * sum(sum(palette[i]) for i in (2, 9, 5))  # everything else black


# ----------------------------------------------------------------------------------------------- networks


def test_minatar_torso_reads_rows_columns_and_channels_from_channel_last_states():
    """One cell (row 2, column 6, channel 3) on; the conv's only tap is the centre of input channel 3, and fc unit
    0 reads conv position (row 1, column 5) of the 8 x 8 valid output: the unit sees the cell, a swapped row and
    column or a wrong channel axis does not."""
    torso = MinAtarTorso((10, 10, 4))
    assert torso.output_size == 128
    assert sum(p.numel() for p in torso.parameters()) == (4 * 9 * 16 + 16) + (16 * 64 * 128 + 128)
    with torch.no_grad():
        for p in torso.parameters():
            p.zero_()
        torso.conv.weight[0, 3, 1, 1] = 1.0
        torso.fc.weight[0, 0 * 64 + 1 * 8 + 5] = 2.0
    state = torch.zeros(2, 10, 10, 4, dtype=torch.bool)
    state[0, 2, 6, 3] = True
    state[1, 6, 2, 3] = True  # the transposed cell
    with torch.no_grad():
        out = torso(state)
        stacked = torso(state.unsqueeze(1))  # [N, S = 1, H, W, C]
    assert out.shape == (2, 128)
    assert out[0, 0] == 2.0 and out[1, 0] == 0.0 and float(out[:, 1:].abs().sum()) == 0.0
    assert torch.equal(stacked, out)


def test_auto_network_is_the_minatar_torso_for_every_agent(tmp_path):
    from seed.learner.configuration import resolve_config

    for agent in ("vtrace", "r2d2", "ppo", "muzero"):
        config = resolve_config(dict(agent=agent, env="minatar:breakout", logdir=str(tmp_path)))
        assert config.network == "minatar", (agent, config.network)


def test_muzero_minatar_network_keeps_10_by_10_and_trains(tmp_path):
    from seed.agents.muzero.agent import make_network
    from seed.learner.configuration import resolve_config

    config = resolve_config(dict(agent="muzero", env="minatar:seaquest", logdir=str(tmp_path), latent_channels=8,
                                 lstm_size=16, projection_size=64))
    spec = envs.make_spec("minatar:seaquest")
    network = make_network(spec, config)
    states = torch.rand(3, 1, 10, 10, 10) < 0.2
    latent, policy, value = network.initial_inference(states)
    assert latent.shape == (3, 8, 10, 10) and policy.shape == (3, 6)
    assert value.shape == (3, 2 * config.value_support_size + 1)
    assert float(latent.detach().min()) >= 0.0 and float(latent.detach().max()) <= 1.0
    next_latent, prefix, _, _, _ = network.recurrent_inference(latent, torch.tensor([0, 3, 5]),
                                                               network.initial_state_lstm(3, latent.device))
    assert next_latent.shape == latent.shape and prefix.shape == (3, 2 * config.reward_support_size + 1)
    # --projection_size: the consistency loss's vectors and the projection's hidden layers are 64 wide, the
    # predictor's hidden layer half of it.
    assert network.project(next_latent, False).shape == network.project(next_latent, True).shape == (3, 64)
    assert network.projection.predictor[0].out_features == 32
    loss = value.sum() + next_latent.sum() + network.project(next_latent, True).sum()
    loss.backward()
    assert float(network.stem.weight.grad.abs().sum()) > 0


def test_muzero_residual_blocks_zero_leaves_one_dynamics_convolution_and_trains(tmp_path):
    """--residual_blocks=0: no residual block after the torso, in the dynamics or before the heads (the dynamics is
    its one convolution), six convolutions fewer than the preset's; the model still acts and every part gets a
    gradient. Negative counts are refused."""
    from seed.agents.muzero.agent import MuZeroAgent, make_network
    from seed.learner.configuration import resolve_config

    spec = envs.make_spec("minatar:breakout")
    networks = {}
    for blocks in (0, 1):
        config = resolve_config(dict(agent="muzero", env="minatar:breakout", logdir=str(tmp_path),
                                     preset="minatar_muzero", residual_blocks=blocks))
        networks[blocks] = make_network(spec, config)
    small, full = networks[0], networks[1]
    for part in ("representation_blocks", "dynamics_blocks", "prediction_blocks"):
        assert len(getattr(small, part)) == 0 and len(getattr(full, part)) == 1, part
    convolutions = lambda network: sum(isinstance(m, torch.nn.Conv2d) for m in network.modules())
    assert convolutions(full) - convolutions(small) == 6  # 3 blocks of 2
    states = torch.rand(4, 1, 10, 10, 4) < 0.2
    latent, policy, value = small.initial_inference(states)
    assert latent.shape == (4, 16, 10, 10) and policy.shape == (4, spec.num_actions)
    next_latent, prefix, _, policy, value = small.recurrent_inference(latent, torch.tensor([0, 1, 2, 0]),
                                                                      small.initial_state_lstm(4, latent.device))
    (value.sum() + prefix.sum() + policy.sum() + next_latent.sum()).backward()
    assert float(small.dynamics_conv.weight.grad.abs().sum()) > 0 and float(small.stem.weight.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match=r"--residual_blocks: got -1, expected >= 0"):
        MuZeroAgent(spec, resolve_config(dict(agent="muzero", env="minatar:breakout", logdir=str(tmp_path),
                                              residual_blocks=-1)))


# ----------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name, agent", [("minatar_vtrace", "vtrace"), ("minatar_ppo", "ppo"),
                                         ("minatar_muzero", "muzero"), ("minatar_r2d2", "r2d2")])
def test_presets_train_breakout_on_the_minatar_network_and_env_picks_the_game(tmp_path, name, agent):
    from seed.learner.configuration import resolve_config

    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": name})
    assert (config.agent, config.env, config.network) == (agent, "minatar:breakout", "minatar")
    assert (config.num_envs, config.num_eval_envs) == (16, 2)
    other = resolve_config({"logdir": str(tmp_path / "run"), "preset": name, "env": "minatar:space_invaders"})
    assert (other.env, other.network) == ("minatar:space_invaders", "minatar")
    assert envs.make_spec(other.env, other.env_options()).observation_shape == (10, 10, 6)


def test_r2d2_preset_is_a_dqn_of_the_minatar_paper_s_sizes(tmp_path):
    """minatar_r2d2's replay and target settings in the paper's transitions: 100K stored, 5K before training, a
    target copy every 32K sampled; its linear Q head and plain targets; its exploration (every training env at
    epsilon 0.1 after 100K agent steps annealed from 1); its uniform replay (no priorities, importance weights all
    1); no LSTM, so no burn-in; 8 transitions sampled per agent step."""
    from seed.agents.r2d2.r2d2 import epsilon_schedule
    from seed.learner.configuration import resolve_config

    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": "minatar_r2d2"})
    assert not config.use_lstm and config.burn_in == 0
    assert config.dueling_hidden == 0  # the paper's head: one linear layer to the Q-values
    assert config.replay_capacity * config.unroll_length == 100_000
    assert config.replay_min_size * config.unroll_length == 5_000
    assert config.target_update_interval * config.batch_size * config.unroll_length == 32_000
    assert config.replay_ratio == 8.0 and config.total_environment_frames == 1_000_000
    assert not config.value_rescaling
    assert config.priority_exponent == 0.0 and config.importance_sampling_exponent == 0.0
    epsilons = epsilon_schedule(config.num_envs, config.num_eval_envs, config.epsilon_base, config.epsilon_alpha,
                                config.eval_epsilon)
    np.testing.assert_allclose(epsilons[:config.num_envs - config.num_eval_envs], 0.1)
    assert config.epsilon_anneal_steps == 100_000


def test_muzero_preset_makes_6560_updates_in_100k_agent_steps(tmp_path):
    """The sizing of minatar_muzero's comment: 100K agent steps, of which the 14 training envs' 87.5K are inserted,
    / 10 positions per sequence = 8,750 sequences, each sampled 6 times in batches of 8: about 6,560 updates of
    8 x 10 unroll starts, each position trained 6 times (the Breakout run made 6,450)."""
    from seed.learner.configuration import resolve_config

    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": "minatar_muzero"})
    assert (config.search, config.num_simulations, config.latent_channels, config.projection_size,
            config.reanalyse_ratio) == ("gumbel", 16, 16, 256, 0.0)
    training_share = (config.num_envs - config.num_eval_envs) / config.num_envs  # evaluation steps are not inserted
    sequences = config.total_environment_frames * training_share / config.unroll_length  # action repeat 1
    assert sequences == 8_750 and config.replay_capacity == 2_000
    assert sequences * config.replay_ratio / config.batch_size == pytest.approx(6_562.5)


# ----------------------------------------------------------------------------------------------- real processes


AGENT_ARGS = {
    "vtrace": ["--batch_size=2", "--unroll_length=8"],
    "r2d2": ["--batch_size=2", "--unroll_length=8", "--burn_in=2", "--replay_min_size=2", "--lstm_size=32"],
    "ppo": ["--sync_every=8", "--ppo_minibatches=2"],
    "muzero": ["--batch_size=2", "--replay_min_size=2", "--num_simulations=4", "--latent_channels=8",
               "--lstm_size=16", "--search=gumbel", "--unroll_steps=2", "--td_steps=2", "--burn_in=3",
               "--unroll_length=4"],
}


@pytest.mark.parametrize("agent, transport", [(agent, "shm") for agent in sorted(AGENT_ARGS)] + [("vtrace", "grpc")])
def test_agent_trains_on_breakout_with_real_learner_and_actors(processes, tmp_path, agent, transport):
    """The learner and one actor process of 2 MinAtar envs (the actor steps minatar:breakout, the learner builds the
    agent's minatar network): a few updates, finished episodes, finite losses. The bool states cross the shared
    step slab, and once gRPC (`--shm_actors=false`: the wire's bool check on every observation)."""
    _needs_minatar()
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    env = ["--env=minatar:breakout", "--envs_per_actor=2", "--seed=1"]
    learner = processes.learner([*env, f"--agent={agent}", f"--logdir={logdir}", f"--server_address={address}",
                                 "--num_actors=1", "--log_interval_s=0.5", "--checkpoint_interval_s=3600",
                                 "--torch_threads=1", f"--shm_actors={transport == 'shm'}", *AGENT_ARGS[agent]])
    processes.actor([*env, f"--server_address={address}", "--actor_index=0"], "actor0")

    def trained():
        rows = read_metrics(logdir)
        return rows if rows and rows[-1]["train_steps"] >= 3 and rows[-1]["episodes"] > 0 else None

    rows = wait_for(trained, 120, f"3 {agent} updates on minatar:breakout",
                    on_timeout=lambda: processes.output(learner)[-3000:])
    assert f"actor 0 connected over {transport}" in processes.output(learner)
    last = rows[-1]
    assert last["env_frames"] > 0 and any(r["episode_return_mean"] is not None for r in rows)
    assert all(math.isfinite(v) for k, v in last.items() if k.startswith("losses/") and v is not None)
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, processes.output(learner)[-3000:]
