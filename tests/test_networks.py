"""Network building blocks: the uint8 frame scaling folded into the first convolution, and the init every agent
gives the plain conv torsos."""

import math

import pytest
import torch
import torch.nn.functional as F

from seed.agents.r2d2.agent import DuelingQNetwork
from seed.agents.torsos import ImpalaDeepTorso, NatureDQNTorso, SmallDQNTorso, conv_on_frames
from seed.agents.vtrace.agent import ActorCriticNetwork
from seed.envs import make_spec
from seed.learner.configuration import resolve_config


@pytest.mark.parametrize("torso_class", [SmallDQNTorso, NatureDQNTorso, ImpalaDeepTorso])
def test_uint8_frames_give_the_same_features_as_frames_scaled_to_one(torso_class):
    torch.manual_seed(0)
    torso = torso_class(4, (84, 84))
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    scaled = frames.float() / 255.0  # float input is passed to the network unscaled
    from_bytes, from_floats = torso(frames), torso(scaled)
    assert from_floats.abs().max() > 1e-3
    torch.testing.assert_close(from_bytes, from_floats, rtol=1e-4, atol=1e-6)


def test_conv_on_frames_scales_only_uint8_input():
    conv = torch.nn.Conv2d(2, 3, 3)
    x = torch.randint(0, 256, (1, 2, 5, 5), dtype=torch.uint8)
    torch.testing.assert_close(conv_on_frames(conv, x), conv(x.float() / 255.0))
    torch.testing.assert_close(conv_on_frames(conv, x.float()), conv(x.float()))
    # The kernel itself is untouched (parameters and checkpoints keep their meaning).
    weight = conv.weight.detach().clone()
    conv_on_frames(conv, x).sum().backward()
    assert torch.equal(conv.weight.detach(), weight) and conv.weight.grad is not None


@pytest.mark.parametrize("agent,network_class", [("r2d2", DuelingQNetwork), ("vtrace", ActorCriticNetwork)])
def test_plain_conv_torsos_start_orthogonal_with_relu_gain(tmp_path, agent, network_class):
    # Glorot or PyTorch's default init leaves the Atari torso's features nearly constant across frames
    # (docs/learning/README.md); both agents start it orthogonal with gain sqrt(2).
    config = resolve_config(dict(agent=agent, env="fake:atari", network="dqn_small", logdir=str(tmp_path)))
    network = network_class(make_spec("fake:atari"), config)
    for layer in network.body.torso.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            w = layer.weight.detach().flatten(1)
            rows = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            torch.testing.assert_close(rows, 2.0 * torch.eye(rows.shape[0]), atol=1e-4, rtol=0)
            assert float(layer.bias.detach().abs().max()) == 0.0
    # The heads keep their own init: Glorot for R2D2's dueling heads (not orthogonal with gain sqrt(2)).
    if agent == "r2d2":
        head = network.advantage[0].weight.detach()
        bound = math.sqrt(6.0 / (head.shape[0] + head.shape[1]))
        assert float(head.abs().max()) <= bound


def test_folded_scaling_trains_like_explicit_scaling():
    # One Adam step from the same weights on the same frames: gradients through the folded 1/255 match.
    torch.manual_seed(1)
    a = SmallDQNTorso(4, (84, 84))
    b = SmallDQNTorso(4, (84, 84))
    b.load_state_dict(a.state_dict())
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    a(frames).square().sum().backward()
    F.relu(b.fc(b.convs(frames.float() / 255.0).flatten(1))).square().sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-6)
