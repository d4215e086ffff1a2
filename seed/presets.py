"""Named learning configurations users can start as they are: `launch/local.sh --preset=pong_vtrace`.

A preset is a layer of flag values. Resolution order (lowest to highest): the config dataclass defaults, the
agent's defaults for the env family, the preset, then the flags the user typed. A preset names its agent and
env, so `--preset=pong_vtrace` alone is a whole run; any flag typed beside it wins over the preset's value.

Both the learner and the actors resolve the preset (the env flags in it, such as the action set, must agree
on both sides or the learner rejects the actor's spec).

Where each preset's values came from is written beside it (`PRESET_SOURCES`) and in README "Learning results".
"""

from __future__ import annotations

from typing import Any

# PPO on the MuJoCo tasks for a 2-core CPU machine: CleanRL's ppo_continuous_action hyperparameters (2048 agent steps
# per rollout, 10 epochs x 32 minibatches of 64 steps, lr 3e-4 annealed to 0, Adam eps 1e-5, gamma 0.99, GAE lambda
# 0.95, clip 0.2, no entropy bonus, value loss weight 0.5, gradient norm 0.5, observations and rewards normalised
# and clipped at 10, separate 2 x 64 tanh MLPs) on the synchronous (HTS) PPO, with these changes: CleanRL's one env
# x 2048 steps is 2 actors x 32 envs x 32 steps (each minibatch: 64 single steps shuffled over the rollout, as
# CleanRL's, --ppo_shuffle_steps; minibatches of 2 whole env columns reached 1,391 on Hopper seed 1 at 1M steps);
# the Gaussian is tanh-squashed into the bounds (CleanRL's is clipped by the env); the value loss is not clipped; no
# evaluation envs (CleanRL reports training episodes); 1M agent steps.
# One torch thread: the 320 minibatch steps of a rollout are tiny ops, which two OpenMP threads make 3x slower on
# 2 cores (1.7 s per rollout against 4.9, this VM); hopper_ppo's rate went from 520 to 1,160 env frames/s.
_MUJOCO_PPO: dict[str, Any] = dict(
    agent="ppo", num_actors=2, envs_per_actor=32, num_eval_envs=0, sync="hts", sync_every=32, ppo_epochs=10,
    ppo_minibatches=32, ppo_shuffle_steps=True, ppo_clip=0.2, learning_rate=3e-4, anneal_learning_rate=True,
    adam_epsilon=1e-5, discounting=0.99, lambda_=0.95, entropy_cost=0.0, baseline_cost=0.5, grad_clip_norm=0.5,
    normalize_observations=True, normalize_rewards=True, mlp_sizes="64,64", use_lstm=False, torch_threads=1,
    total_environment_frames=1e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
)

PRESETS: dict[str, dict[str, Any]] = {
    # V-trace on Pong for a 2-core CPU machine: the 2013 DQN network without LSTM (a third of the Nature
    # network's compute, which a 2-core learner cannot keep up with), Pong's 6-action minimal set, batches of
    # 8 unrolls (A2C-sized) for more updates per frame: on 2 cores the envs, not training, limit the rate.
    "pong_vtrace": dict(
        agent="vtrace", env="atari:Pong", network="dqn_small", use_lstm=False, atari_minimal_action_set=True,
        num_actors=2, envs_per_actor=8, num_eval_envs=2, batch_size=8, unroll_length=20,
        learning_rate=6e-4, entropy_cost=0.01, max_abs_reward=1.0, grad_clip_norm=40.0,
        total_environment_frames=50e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # PPO on Pong for a 2-core CPU machine: CleanRL's Atari PPO recipe (rollouts of 128 steps, 4 epochs x 4
    # minibatches, lr 2.5e-4, clip 0.1, entropy 0.01, gradient norm 0.5, GAE 0.95) on the 2013 DQN network,
    # synchronous (HTS) with 14 training envs and 2 evaluation envs.
    "pong_ppo": dict(
        agent="ppo", env="atari:Pong", network="dqn_small", use_lstm=False, atari_minimal_action_set=True,
        num_actors=2, envs_per_actor=8, num_eval_envs=2, sync="hts", sync_every=128, ppo_epochs=4,
        ppo_minibatches=4, ppo_clip=0.1, learning_rate=2.5e-4, entropy_cost=0.01, discounting=0.99, lambda_=0.95,
        max_abs_reward=1.0, grad_clip_norm=0.5, total_environment_frames=50e6, log_interval_s=30.0,
        checkpoint_interval_s=300.0,
    ),
    # V-trace on Pong for one GPU + 16 cores: the paper's network (IMPALA deep + LSTM) on the GPU.
    "pong_vtrace_gpu": dict(
        agent="vtrace", env="atari:Pong", network="impala_deep", use_lstm=True, atari_minimal_action_set=True,
        num_actors=14, envs_per_actor=16, num_eval_envs=8, batch_size=32, unroll_length=20,
        inference_device="cuda:0", training_device="cuda:0", learning_rate=6e-4, entropy_cost=0.01,
        max_abs_reward=1.0, grad_clip_norm=40.0, total_environment_frames=50e6, log_interval_s=10.0,
    ),
    # R2D2 on Pong for a 2-core CPU machine: the 2013 DQN torso with a 256-unit LSTM, sequences of 10 steps after a
    # burn-in of 2 (instead of 80 + 40: a 2-core learner trains about 1,200 sequence steps a second, and many short
    # updates learn Pong sooner than few long ones), Pong's 6 actions, 2 actors x 8 envs (2 evaluate), every
    # inserted step trained twice on average (replay ratio 2: the cores go to training), a target copied every 200
    # updates, lr 2e-4 with Adam eps 1e-5, discount 0.99 and 3-step returns: DQN's Pong regime rather than the
    # paper's 57-game one. The paper's eps 1e-3 is far above R2D2's gradients here (value-rescaled TD errors of a
    # few hundredths): it held the median weight to 1.8% of lr (optimizer/adam_step_fraction). The replay holds
    # 10,000 sequences (130K agent steps, 1.1 GB).
    "pong_r2d2": dict(
        agent="r2d2", env="atari:Pong", network="dqn_small", use_lstm=True, lstm_size=256,
        atari_minimal_action_set=True, num_actors=2, envs_per_actor=8, num_eval_envs=2, inference_batch_size=-1,
        batch_size=32, unroll_length=10, burn_in=2, replay_capacity=10_000, replay_min_size=500, replay_ratio=2.0,
        target_update_interval=200, learning_rate=2e-4, adam_epsilon=1e-5, discounting=0.99, n_steps=3,
        total_environment_frames=50e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # R2D2 on Pong for one GPU + 16 cores: paper Table 8 with a replay that fits a 128 GiB host.
    "pong_r2d2_gpu": dict(
        agent="r2d2", env="atari:Pong", num_actors=16, envs_per_actor=16, num_eval_envs=8,
        inference_device="cuda:0", training_device="cuda:0", replay_capacity=50_000, replay_min_size=2_000,
        total_environment_frames=200e6, log_interval_s=10.0,
    ),
    # V-trace on Football academy_empty_goal_close for a 2-core CPU machine: a small network that a CPU
    # trains fast, scoring reward, the SMM observation; HTS-RL's 16 training envs plus 2 evaluation envs.
    "football_close_vtrace": dict(
        agent="vtrace", env="football:academy_empty_goal_close", network="football_small", use_lstm=False,
        num_actors=2, envs_per_actor=9, num_eval_envs=2, batch_size=8, unroll_length=32,
        learning_rate=6e-4, entropy_cost=0.01, discounting=0.993, lambda_=0.95,
        total_environment_frames=5e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    "football_goal_vtrace": dict(
        agent="vtrace", env="football:academy_empty_goal", network="football_small", use_lstm=False,
        num_actors=2, envs_per_actor=9, num_eval_envs=2, batch_size=8, unroll_length=32,
        learning_rate=6e-4, entropy_cost=0.01, discounting=0.993, lambda_=0.95,
        total_environment_frames=20e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # HTS-RL (Liu, Schwing et al. 2020) on Football academy_empty_goal_close: synchronous PPO, 16 training envs
    # (plus 2 evaluation envs), a rollout of 128 steps per env, 2 epochs x 8 minibatches, lr 3.43e-4, scoring +
    # checkpoint rewards.
    "football_close_ppo": dict(
        agent="ppo", env="football:academy_empty_goal_close", network="football_small", use_lstm=False,
        football_rewards="scoring,checkpoints", num_actors=2, envs_per_actor=9, num_eval_envs=2, sync="hts",
        sync_every=128,
        ppo_epochs=2, ppo_minibatches=8, ppo_clip=0.2, learning_rate=3.43e-4, entropy_cost=0.01,
        discounting=0.993, lambda_=0.95, grad_clip_norm=0.5, total_environment_frames=5e6, log_interval_s=30.0,
        checkpoint_interval_s=300.0,
    ),
    # HTS-RL's PPO on academy_empty_goal: football_close_ppo's settings on the longer scenario (HTS-RL Table 2
    # has both; the shaped checkpoint rewards matter more here, where the goal is half a pitch away).
    "football_goal_ppo": dict(
        agent="ppo", env="football:academy_empty_goal", network="football_small", use_lstm=False,
        football_rewards="scoring,checkpoints", num_actors=2, envs_per_actor=9, num_eval_envs=2, sync="hts",
        sync_every=128,
        ppo_epochs=2, ppo_minibatches=8, ppo_clip=0.2, learning_rate=3.43e-4, entropy_cost=0.01,
        discounting=0.993, lambda_=0.95, grad_clip_norm=0.5, total_environment_frames=20e6, log_interval_s=30.0,
        checkpoint_interval_s=300.0,
    ),
    # Synchronous PPO on CartPole, bit-identical for one seed (--deterministic): the agent's gym defaults.
    "cartpole_ppo": dict(
        agent="ppo", env="gym:CartPole-v1", num_actors=2, envs_per_actor=4, sync="hts", deterministic=True,
        total_environment_frames=1e6,
    ),
    # MuZero (EfficientZero) on CartPole for a 2-core CPU machine: the agent's gym defaults (an MLP model, K = 5)
    # with Gumbel MuZero's search (25 simulations; training envs play its sequential-halving action, evaluation envs
    # the argmax of its improved policy) and muzero-pytorch's CartPole discount 0.997, n = 10 and Dirichlet alpha
    # 0.25 (mixed into the training envs' root prior); sequences of 15 starts (burn_in >= K + n - 1 = 14 must stay
    # below unroll_length); 2 actors x 4 envs of which 2 evaluate, one search for both actors' 8 envs. Many updates
    # per env step (batches of 8 sequences = 120 unrolls, each inserted position trained 64 times) on a replay of
    # the last 700 sequences (~10K positions): with the whole run in the replay, the first searches' policy
    # targets stayed in it and runs stalled at 105-250 (docs/learning/README.md).
    "cartpole_muzero": dict(
        agent="muzero", env="gym:CartPole-v1", num_actors=2, envs_per_actor=4, num_eval_envs=2,
        inference_batch_size=8, batch_size=8, replay_ratio=64.0, replay_capacity=700, search="gumbel",
        total_environment_frames=60_000, log_interval_s=10.0, discounting=0.997, td_steps=10, burn_in=14,
        unroll_length=15, dirichlet_alpha=0.25,
    ),
    # MuZero (EfficientZero) on Atari 100k for one GPU + 16 cores: the agent's Atari defaults (EfficientZero's
    # model, K = 5, n = 5, 50 pUCT simulations, supports of 601 atoms, target copied every 200 updates, priority
    # exponent 0.6) with SpeedyZero's Table 6 env settings that this framework has: 96 x 96 frames (grayscale, not
    # RGB), rewards clipped to [-1, 1], an episode cap of 12K agent steps; full reanalysis (every sampled
    # sequence re-searched with the target network); batches of 26 sequences = 260 unroll starts (EfficientZero's
    # 256); each inserted position trained about 26 times (EfficientZero trains 256 positions per agent step);
    # 100K agent steps = 400K frames. Terminal on loss of life is not built (Pong has no lives).
    "atari100k_muzero_gpu": dict(
        agent="muzero", env="atari:Pong", atari_minimal_action_set=True, atari_frame_size=96,
        atari_max_frames=48_000, num_actors=8, envs_per_actor=4, num_eval_envs=4, inference_batch_size=-1,
        inference_device="cuda:0", training_device="cuda:0", reanalyse_ratio=1.0, replay_ratio=26.0,
        replay_capacity=10_000, replay_min_size=200, total_environment_frames=400_000, log_interval_s=10.0,
        checkpoint_interval_s=600.0,
    ),
    # MuZero on Pong for a 2-core CPU machine (the Atari 100k protocol's 100K agent steps): EfficientZero's losses
    # and horizons on a model sized for 2 cores (the Table 5 network with 32 channels and the Nature DQN's
    # convolutions as its downsampling: 1.9 s per update against the ResNet torso's 4.4 s on one core,
    # docs/learning/README.md; a 128-unit value-prefix LSTM, supports of 41 / 11 atoms, enough for clipped
    # rewards), Gumbel MuZero's root selection with 8 simulations (Danihelka et al.: few simulations) and Table 9's
    # 84 x 84 frames; half of each batch reanalysed; 2 actors x 8 envs (2 evaluate), batches of 8 sequences, each
    # inserted position trained 8 times.
    "pong_muzero": dict(
        agent="muzero", env="atari:Pong", atari_minimal_action_set=True, num_actors=2, envs_per_actor=8,
        num_eval_envs=2, inference_batch_size=-1, network="nature", latent_channels=32, lstm_size=128,
        value_support_size=20, reward_support_size=5, search="gumbel", num_simulations=8, batch_size=8,
        replay_ratio=8.0, reanalyse_ratio=0.5, replay_capacity=10_000, replay_min_size=100,
        total_environment_frames=400_000, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # MinAtar (Young & Tian 2019) for a 2-core CPU machine; `--env=minatar:<game>` picks another of the five games.
    # V-trace: pong_vtrace's 2-core shape (2 actors x 8 envs of which 2 evaluate, batches of 8 unrolls of 20, lr 6e-4,
    # entropy 0.01) on the MinAtar paper's network (the agent's minatar default: conv 16 3x3, fc 128, no LSTM) with
    # its discount 0.99 and unclipped rewards, for the paper's 5M frames.
    "minatar_vtrace": dict(
        agent="vtrace", env="minatar:breakout", num_actors=2, envs_per_actor=8, num_eval_envs=2, batch_size=8,
        unroll_length=20, learning_rate=6e-4, entropy_cost=0.01, discounting=0.99, grad_clip_norm=40.0,
        total_environment_frames=5e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # PPO: pong_ppo's CleanRL Atari recipe (rollouts of 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4, entropy 0.01,
    # gradient norm 0.5, GAE 0.95) with CleanRL's clip 0.2 and unclipped rewards, on the MinAtar paper's network,
    # synchronous (HTS), 2 x 8 envs (2 evaluate), 5M frames.
    "minatar_ppo": dict(
        agent="ppo", env="minatar:breakout", num_actors=2, envs_per_actor=8, num_eval_envs=2, sync="hts",
        sync_every=128, ppo_epochs=4, ppo_minibatches=4, ppo_clip=0.2, learning_rate=2.5e-4, entropy_cost=0.01,
        discounting=0.99, lambda_=0.95, grad_clip_norm=0.5, total_environment_frames=5e6, log_interval_s=30.0,
        checkpoint_interval_s=300.0,
    ),
    # MuZero for 100K agent steps (the Atari 100k budget) on 2 cores in under an hour: the agent's minatar defaults
    # (the gym settings: K = 5, n = 5, supports of 41 / 11 atoms, lr 1e-3, discount 0.99 as the MinAtar paper) on the
    # ResNet model at 10 x 10 with 16 latent channels and a SimSiam projection of 256 (EfficientZero's 1024 was 40%
    # of an update here: its 1,600 x 1,024 layer outweighs the convolutions of a 16-channel latent), Gumbel MuZero's
    # search with 16 simulations, 2 x 8 envs (2 evaluate), batches of 8 sequences (80 unroll starts), each inserted
    # position trained 6 times, a replay of the last 2,000 sequences (20K positions, a fifth of the run, as
    # cartpole_muzero's small replay), no reanalysis. Sizing, from one update's CPU time on this VM (torch 1 thread):
    # 16 channels with the 256 projection take 0.36-0.39 s per update (0.50-0.54 with the 1024 one; 32 channels
    # 1.5), and 100K agent steps make 8,750 sequences (the 2 evaluation envs' steps are not inserted), so 6,560
    # updates are about 2,500 CPU s on the training process's core; the 8-env searches (about 100 ms each) run on
    # the other core: 40 minutes of 2 cores for Breakout (docs/learning/README.md, MinAtar). Measured and not
    # taken (Space Invaders, docs/learning/minatar.md): a reanalysis worker (--reanalyse_workers=1) and
    # --residual_blocks=0 with a 128 projection and a 64 LSTM at replay ratio 12 both ended 100K lower; this model
    # at ratio 12 was higher on one seed and lower on the other, and needs about 75 minutes per 100K.
    "minatar_muzero": dict(
        agent="muzero", env="minatar:breakout", num_actors=2, envs_per_actor=8, num_eval_envs=2,
        inference_batch_size=-1, latent_channels=16, projection_size=256, lstm_size=128, search="gumbel",
        num_simulations=16, batch_size=8, replay_ratio=6.0, reanalyse_ratio=0.0, replay_capacity=2_000,
        replay_min_size=100, discounting=0.99, total_environment_frames=100_000, log_interval_s=30.0,
        checkpoint_interval_s=300.0,
    ),
    # R2D2 as a DQN on MinAtar (issue 50's model-free baseline): the MinAtar paper's DQN network (conv 16 3x3, fc 128,
    # one linear layer to the Q-values: R2D2's dueling heads of 512 held Asterix at 1.2 at 500K agent steps, this
    # head 3.2, and update 30% faster; docs/learning/minatar_r2d2.md) without an LSTM (so no burn-in), its replay of
    # 100K transitions (10K sequences of 10) filled to 5K (500 sequences) before training, its discount 0.99,
    # Adam at its lr 2.5e-4, its plain targets (no value rescaling: h(x) held Asterix) and its exploration (epsilon
    # 0.1 on every training env, annealed from 1 over the first 100K agent steps: R2D2's per-env epsilons of 0.4
    # down to 0.0016 learnt less on Asterix and Freeway) and its uniform replay (R2D2's prioritized sequence replay
    # held Freeway at 36 and Asterix at 12.7); 3-step double-Q targets on sequences of 10; a target copy every 100
    # updates of 32 x 10 transitions (the paper's 1,000 updates of 32). Replay ratio 8 sequences per sequence
    # inserted (8 sampled transitions per agent step, a quarter of the paper's 32: ratio 16 learnt less on Asterix
    # and Freeway, 32 less still): 1M agent steps in 6-10 minutes on 2 cores.
    "minatar_r2d2": dict(
        agent="r2d2", env="minatar:breakout", num_actors=2, envs_per_actor=8, num_eval_envs=2, network="minatar",
        dueling_hidden=0, use_lstm=False, burn_in=0, unroll_length=10, n_steps=3, batch_size=32, replay_capacity=10_000,
        replay_min_size=500, replay_ratio=8.0, priority_exponent=0.0, importance_sampling_exponent=0.0,
        target_update_interval=100, learning_rate=2.5e-4,
        value_rescaling=False, epsilon_base=0.1, epsilon_alpha=0.0, epsilon_anneal_steps=100_000,
        discounting=0.99, total_environment_frames=1_000_000, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # SAC on HalfCheetah-v5 for a 2-core CPU machine: CleanRL's sac_continuous_action (the agent's defaults: MLPs of
    # 2 x 256, batch 256, gamma 0.99, q lr 1e-3, policy lr 3e-4, tau 0.005, policy every 2 updates, learning starts
    # at 5K transitions, a 1M replay) with one update of 256 transitions per agent step (replay ratio 256 with
    # sequences of one transition); 1 actor x 4 envs, of which 1 evaluates (the policy's mode); 1M agent steps. One
    # torch thread: an update takes 28 ms with one and 906 ms with two while the other core is busy (OpenMP's
    # threads wait on each other; this VM, a PPO run beside it).
    "halfcheetah_sac": dict(
        agent="sac", env="gym:HalfCheetah-v5", num_actors=1, envs_per_actor=4, num_eval_envs=1, torch_threads=1,
        total_environment_frames=1e6, log_interval_s=30.0, checkpoint_interval_s=300.0,
    ),
    # SAC on HalfCheetah-v5 for one GPU + 16 cores: halfcheetah_sac's CleanRL settings with training and inference on
    # the GPU and 8 actors x 2 envs (2 evaluate); still one update of 256 transitions per agent step.
    "halfcheetah_sac_gpu": dict(
        agent="sac", env="gym:HalfCheetah-v5", num_actors=8, envs_per_actor=2, num_eval_envs=2,
        inference_device="cuda:0", training_device="cuda:0", total_environment_frames=1e6, log_interval_s=10.0,
        checkpoint_interval_s=300.0,
    ),
    # PPO on Hopper-v5 for a 2-core CPU machine: the whole of CleanRL's ppo_continuous_action, not only its
    # hyperparameters (_MUJOCO_PPO): its unsquashed Gaussian that the env clips (--box_policy=clipped), its value
    # clipping at 0.2 and its synchronous rollouts (--sync_lag=0: each rollout acted with the update on the one
    # before), as 2 actors x 8 envs x 128 steps (2,048 per rollout; each minibatch 64 single steps). The other two
    # presets' 64 envs x 32 steps with the tanh squash and HTS's lag made 2,143 over nine Hopper seeds; this one 2,598
    # over seeds 1-3 and 2,345 over seeds 1-6 in 11 minutes each, against CleanRL's 2,383 (docs/learning, "Hopper: 32
    # minibatches again").
    "hopper_ppo": dict(_MUJOCO_PPO, env="gym:Hopper-v5", envs_per_actor=8, sync_every=128, sync_lag=0,
                       box_policy="clipped", ppo_value_clip=0.2),
    "halfcheetah_ppo": dict(_MUJOCO_PPO, env="gym:HalfCheetah-v5"),
    "walker2d_ppo": dict(_MUJOCO_PPO, env="gym:Walker2d-v5"),
    # PPO on HalfCheetah-v5 for one GPU + 16 cores: the 2-core settings with inference and training on the GPU and
    # 8 actors x 16 envs x 16 steps (still 2048 steps per rollout; each minibatch 4 env columns of 16 steps).
    "halfcheetah_ppo_gpu": dict(
        _MUJOCO_PPO, env="gym:HalfCheetah-v5", num_actors=8, envs_per_actor=16, sync_every=16,
        inference_device="cuda:0", training_device="cuda:0", torch_threads=0, log_interval_s=10.0,
    ),
}

PRESET_SOURCES: dict[str, str] = {
    "pong_vtrace": "IMPALA's Atari settings (unroll 20, entropy 0.01, rewards clipped to [-1, 1]) on the Nature "
                   "DQN network; batch 8 and lr 6e-4 chosen on this framework on 2 CPU cores "
                   "(docs/learning/README.md).",
    "pong_ppo": "CleanRL's Atari PPO hyperparameters (ppo_atari.py) on the 2013 DQN network; synchronous HTS "
                "rollouts; on 2 CPU cores it runs at 1,337 FPS and had not left -21 after 2.3M frames "
                "(docs/learning/README.md).",
    "pong_vtrace_gpu": "IMPALA deep + LSTM (the paper's network) with IMPALA's Atari settings; not yet measured "
                       "on a GPU here.",
    "pong_r2d2": "R2D2 (SEED's Table 8 machinery: LSTM, burn-in, prioritized sequence replay, double-Q n-step "
                 "targets with value rescaling, per-env epsilons) sized for a 2-core CPU learner; sequence length, "
                 "replay ratio, target interval, lr, Adam eps, discount and n chosen here (docs/learning/README.md).",
    "pong_r2d2_gpu": "SEED paper Table 8 (the agent's Atari defaults) with a 50K-sequence replay; not yet "
                     "measured on a GPU here.",
    "football_close_vtrace": "HTS-RL's scenario and protocol; network and learning rate chosen on this framework "
                             "on 2 CPU cores (docs/learning/README.md).",
    "football_goal_vtrace": "as football_close_vtrace, on academy_empty_goal.",
    "football_close_ppo": "HTS-RL's paper settings (16 envs, sync every 128 steps, PPO 2 epochs x 8 minibatches, "
                          "lr 3.43e-4, scoring,checkpoints rewards) with the small Football network; not yet "
                          "measured here.",
    "football_goal_ppo": "as football_close_ppo, on academy_empty_goal.",
    "cartpole_muzero": "the MuZero agent's gym defaults (EfficientZero's losses, K and horizons; supports and "
                       "network sized for CartPole on 2 CPU cores) with muzero-pytorch's CartPole discount 0.997, "
                       "n = 10 and Dirichlet alpha 0.25; Gumbel search, replay ratio 64 and a 700-sequence replay "
                       "chosen here (docs/learning/README.md).",
    "atari100k_muzero_gpu": "EfficientZero's Atari 100k configuration (the agent's Atari defaults) with SpeedyZero's "
                            "Table 6 env settings (96 x 96 grayscale, reward clipping, 12K-step episodes) and full "
                            "reanalysis; not yet measured on a GPU here.",
    "pong_muzero": "EfficientZero's losses and horizons on a 2-core-sized model (32 channels, the Nature DQN's "
                   "convolutions as the downsampling) with 8 Gumbel simulations and half of each batch reanalysed; "
                   "docs/learning/README.md.",
    "minatar_vtrace": "pong_vtrace's 2-core shape on the MinAtar paper's network, discount and 5M frames; 1M "
                      "agent steps of each game take 3.5-5.3 minutes on 2 cores (docs/learning/README.md, MinAtar).",
    "minatar_ppo": "CleanRL's Atari PPO recipe (pong_ppo's, clip 0.2) on the MinAtar paper's network; 1M agent "
                   "steps of each game take 3.5-5.6 minutes on 2 cores (docs/learning/README.md, MinAtar).",
    "minatar_muzero": "the MuZero agent's minatar defaults (its gym settings on a 10 x 10 ResNet model, with a "
                      "256-wide SimSiam projection) sized from one update's CPU time to run 100K agent steps in "
                      "under an hour on 2 cores (docs/learning/README.md, MinAtar).",
    "minatar_r2d2": "the MinAtar paper's DQN settings (network and its linear Q head, 100K-transition replay from 5K, "
                    "discount, lr 2.5e-4, target every 32K sampled transitions, plain targets, epsilon 0.1 annealed "
                    "from 1 over 100K steps, uniform replay) in R2D2's machinery without the LSTM: 3-step double-Q "
                    "targets on sequences of 10, replay ratio 8 "
                    "(docs/learning/minatar_r2d2.md).",
    "halfcheetah_sac": "CleanRL's sac_continuous_action defaults (cleanrl/sac_continuous_action.py: batch 256, "
                       "gamma 0.99, q lr 1e-3, policy lr 3e-4, tau 0.005, policy frequency 2, learning starts 5e3, "
                       "buffer 1e6, log-std in [-5, 2]) with its one update per agent step; the env and actor "
                       "counts chosen here for 2 CPU cores.",
    "halfcheetah_sac_gpu": "halfcheetah_sac's CleanRL settings on one GPU; not yet measured on a GPU here.",
    "hopper_ppo": "CleanRL's ppo_continuous_action (cleanrl/ppo_continuous_action.py: 2048 steps per rollout, 10 "
                  "epochs x 32 minibatches, lr 3e-4 annealed, gamma 0.99, lambda 0.95, clip 0.2, ent 0, vf 0.5, "
                  "max grad norm 0.5, obs and reward normalisation, value clipping 0.2, a Gaussian the env clips, "
                  "synchronous rollouts) as 2 x 8 envs x 128 steps, minibatches of 64 steps shuffled over the "
                  "rollout.",
    "halfcheetah_ppo": "CleanRL's ppo_continuous_action hyperparameters (as hopper_ppo's) on our synchronous PPO as "
                       "2 x 32 envs x 32 steps, minibatches of 64 steps shuffled over the rollout, tanh-squashed "
                       "actions, no value clipping, HTS's one-update acting lag (see _MUJOCO_PPO).",
    "walker2d_ppo": "as halfcheetah_ppo (CleanRL's ppo_continuous_action hyperparameters, 2 x 32 envs x 32 steps, "
                    "tanh, HTS's lag).",
    "halfcheetah_ppo_gpu": "halfcheetah_ppo's CleanRL settings with 8 x 16 envs x 16 steps on one GPU; not yet "
                           "measured on a GPU here.",
    "cartpole_ppo": "the PPO agent's gym defaults (rl-baselines3-zoo's CartPole PPO; tests/test_learning.py), "
                    "deterministic.",
}


def preset(name: str) -> dict[str, Any]:
    """The flag values of preset `name` (a copy); '' is the empty preset. ValueError names the valid ones."""
    if not name:
        return {}
    if name not in PRESETS:
        raise ValueError(f"--preset: got {name!r}, expected one of {', '.join(sorted(PRESETS))}")
    return dict(PRESETS[name])


def fields_of(values: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """The entries of `values` whose keys are in `names` (an actor takes only the env flags of a preset)."""
    return {key: value for key, value in values.items() if key in names}
