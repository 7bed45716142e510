//! The weight step on a tiny model. RFT trains on the completion tokens of kept rollouts only,
//! an empty kept set leaves the weights exactly as they were, and with `[weights.lora]` it
//! trains the adapter the policy serves and never the base. GRPO learns from the tasks whose
//! rollouts differ, on the tokens as sampled, with ratio 1 at its first update, and leaves the
//! weights bit for bit alone when no task's rollouts differ.

mod common;

use candle_core::{Device, Var};
use std::sync::Arc;
use whale_core::Domain;
use whale_harness::{stock_harness, Limits};
use whale_lm::{LoraConfig, Qwen3Model};
use whale_loop::config::{Algorithm, WeightConfig};
use whale_loop::weight_phase::{
    apply, call_example, kept, new_trainer, resume_trainer, save_trainer, trainer_config, WeightPhase,
};
use whale_policy::SamplingParams;
use whale_tasks::{task_domain, Environment};
use whale_train::SftTrainer;

/// Every parameter of the model, flattened, in a fixed order.
fn weights(trainer: &SftTrainer<Qwen3Model>) -> Vec<Vec<f32>> {
    trainer
        .model()
        .named_parameters()
        .iter()
        .map(|(_, var)| var.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32 weights"))
        .collect()
}

struct Setup {
    policy: Arc<whale_engine::LocalPolicy>,
    trainer: SftTrainer<Qwen3Model>,
    tasks: Vec<whale_core::Task>,
    environment: Environment,
}

fn setup() -> Setup {
    let policy = Arc::new(common::tiny_policy());
    let pad = policy.tokenizer().specials().endoftext;
    let trainer = SftTrainer::new(
        policy.served_model::<Qwen3Model>("the test").expect("a Qwen3 model"),
        trainer_config(&config(0.0), pad),
    )
    .expect("trainer");
    let tasks = task_domain(Domain::Math).generate(12, 5, 1);
    let environment = Environment::for_tasks(Domain::Math, &tasks).expect("environment");
    Setup { policy, trainer, tasks, environment }
}

fn config(threshold: f64) -> WeightConfig {
    WeightConfig {
        tasks_per_step: 3,
        rollouts_per_task: 2,
        reward_threshold: threshold,
        mini_batch: 4,
        micro_batch: 2,
        learning_rate: 1e-3,
        skip_truncated: false,
        ..WeightConfig::default()
    }
}

/// The weight phase under test: 4 threads, seed 3, no progress bar.
fn phase<'a>(
    config: &'a WeightConfig,
    environment: &'a Environment,
    train: &'a [whale_core::Task],
    sampling: &'a SamplingParams,
    limits: &'a Limits,
) -> WeightPhase<'a> {
    WeightPhase { config, environment, train, limits, sampling, threads: 4, seed: 3, progress: false }
}

#[test]
fn a_step_trains_on_the_completion_tokens_of_kept_rollouts_only() {
    let mut s = setup();
    let config = config(-1.0);
    let sampling = SamplingParams { max_tokens: 12, ..SamplingParams::default() };
    let limits = Limits::default();
    let phase = phase(&config, &s.environment, &s.tasks, &sampling, &limits);
    let harness = stock_harness("math/plain").expect("stock").harness();
    let before = weights(&s.trainer);
    let (report, journal, kept_rollouts) = phase.step(1, &[harness], &s.policy, &mut s.trainer, None).expect("step");
    assert_eq!(report.rollouts, 6);
    assert_eq!(report.kept, 6, "a negative threshold keeps every rollout");
    assert_eq!(kept_rollouts.len(), 6);
    let examples: Vec<_> = journal.mini_batches.iter().flatten().collect();
    assert_eq!(examples.len(), report.examples);
    assert_eq!(journal.mini_batches.len(), report.updates);
    assert_eq!(report.updates, report.examples.div_ceil(4));
    // The loss counted exactly the completion tokens: prompts are context, never targets.
    let completion: usize = examples.iter().map(|e| e.completion.len()).sum();
    let prompt: usize = examples.iter().map(|e| e.prompt.len()).sum();
    assert_eq!(report.trained_tokens, completion);
    assert!(prompt > 0 && completion > 0, "both parts present ({prompt}, {completion}), so the check bites");
    // The examples are the kept rollouts' own calls, rendered as the policy saw them.
    let rendered: Vec<_> = kept_rollouts
        .iter()
        .flat_map(|t| t.model_calls.iter())
        .map(|call| call_example(&s.policy, call).expect("render"))
        .collect();
    let mut sorted_rendered = rendered.clone();
    let mut sorted_journal: Vec<_> = examples.iter().map(|e| (*e).clone()).collect();
    sorted_rendered.sort_by(|a, b| (&a.prompt, &a.completion).cmp(&(&b.prompt, &b.completion)));
    sorted_journal.sort_by(|a, b| (&a.prompt, &a.completion).cmp(&(&b.prompt, &b.completion)));
    assert_eq!(sorted_rendered, sorted_journal);
    assert_ne!(weights(&s.trainer), before, "the update changed the weights");
}

#[test]
fn an_empty_kept_set_changes_nothing() {
    let mut s = setup();
    let config = config(1.0);
    let sampling = SamplingParams { max_tokens: 8, ..SamplingParams::default() };
    let limits = Limits::default();
    let phase = phase(&config, &s.environment, &s.tasks, &sampling, &limits);
    let harness = stock_harness("math/plain").expect("stock").harness();
    let before = weights(&s.trainer);
    let steps_before = s.trainer.state().step;
    let (report, journal, kept_rollouts) = phase.step(1, &[harness], &s.policy, &mut s.trainer, None).expect("step");
    assert_eq!(report.rollouts, 6);
    assert_eq!((report.kept, report.examples, report.updates, report.trained_tokens), (0, 0, 0, 0));
    assert!(kept_rollouts.is_empty() && journal.mini_batches.is_empty());
    assert_eq!(report.loss, None);
    assert_eq!(s.trainer.state().step, steps_before);
    assert_eq!(weights(&s.trainer), before, "bit for bit");
}

#[test]
fn the_threshold_is_strict_and_steps_draw_every_task_once_per_epoch() {
    let s = setup();
    let config = config(0.5);
    let sampling = SamplingParams::default();
    let limits = Limits::default();
    let phase = WeightPhase { threads: 1, seed: 9, ..phase(&config, &s.environment, &s.tasks, &sampling, &limits) };
    let mut drawn: Vec<String> = (1..=4).flat_map(|step| phase.draw(step)).map(|t| t.id.clone()).collect();
    assert_eq!(drawn.len(), 12);
    drawn.sort();
    drawn.dedup();
    assert_eq!(drawn.len(), 12, "four steps of three cover the twelve tasks once");
    assert_eq!(
        phase.draw(2).iter().map(|t| &t.id).collect::<Vec<_>>(),
        phase.draw(2).iter().map(|t| &t.id).collect::<Vec<_>>()
    );
    assert!(kept(&[], 0.5).is_empty());
}

fn values(params: Vec<(String, Var)>) -> Vec<(String, Vec<f32>)> {
    params
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32")))
        .collect()
}

#[test]
fn a_lora_step_trains_the_adapter_the_policy_serves_and_never_the_base() {
    let policy = Arc::new(common::tiny_policy());
    let base = policy.served_model::<Qwen3Model>("the test").expect("a Qwen3 model");
    let base_before = values(base.named_parameters());
    let mut config = config(-1.0);
    config.lora =
        Some(LoraConfig { rank: 4, target_modules: vec!["q_proj".into(), "up_proj".into()], ..LoraConfig::default() });
    let mut run_trainer = new_trainer(&config, &policy, 11).expect("trainer");
    let served = || {
        values(
            policy
                .served_model::<Qwen3Model>("the test")
                .expect("a Qwen3 model")
                .adapter()
                .expect("the policy serves the adapter")
                .named_parameters(),
        )
    };
    let adapter_before = served();
    assert_eq!(adapter_before.len(), 2 * 2 * base.config().num_hidden_layers);

    let tasks = task_domain(Domain::Math).generate(12, 5, 1);
    let environment = Environment::for_tasks(Domain::Math, &tasks).expect("environment");
    let sampling = SamplingParams { max_tokens: 12, ..SamplingParams::default() };
    let limits = Limits::default();
    let phase = phase(&config, &environment, &tasks, &sampling, &limits);
    let harness = stock_harness("math/plain").expect("stock").harness();
    let (report, _, _) = phase.step_run(1, &[harness], &policy, &mut run_trainer, None).expect("step");
    assert!(report.updates > 0, "{report:?}");
    assert_eq!(values(base.named_parameters()), base_before, "the base is bit for bit what it was");
    let trained = served();
    assert_ne!(trained, adapter_before, "the served adapter is the trained one");
    let trainer_model = run_trainer.decoder().downcast_ref::<whale_lm::Qwen3Model>().cloned().expect("a Qwen3 trainer");
    assert_eq!(trained, values(trainer_model.adapter().expect("adapter").named_parameters()));

    let dir = tempfile::tempdir().expect("tempdir");
    let state = run_trainer.state();
    save_trainer(&run_trainer, dir.path(), std::path::Path::new("/models/base")).expect("save");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("adapter_config.json")).expect("adapter config"))
            .expect("json");
    assert_eq!(saved["base_model_name_or_path"], "/models/base");
    let other = Arc::new(common::tiny_policy());
    let resumed = resume_trainer(&config, &other, dir.path(), &Device::Cpu).expect("resume");
    assert_eq!(resumed.state(), state);
    assert_eq!(
        values(
            other
                .served_model::<Qwen3Model>("the test")
                .expect("a Qwen3 model")
                .adapter()
                .expect("adapter")
                .named_parameters()
        ),
        trained
    );
}

fn grpo(tasks_per_step: usize) -> WeightConfig {
    WeightConfig { algorithm: Algorithm::Grpo, tasks_per_step, rollouts_per_task: 4, mini_batch: 1024, ..config(0.5) }
}

#[test]
fn a_grpo_step_without_reward_spread_leaves_the_weights_bit_identical() {
    let mut s = setup();
    let config = grpo(3);
    let sampling = SamplingParams { max_tokens: 8, ..SamplingParams::default() };
    let limits = Limits::default();
    let phase = phase(&config, &s.environment, &s.tasks, &sampling, &limits);
    let harness = stock_harness("math/plain").expect("stock").harness();
    let before = weights(&s.trainer);
    let (report, journal, _) = phase.step(1, &[harness], &s.policy, &mut s.trainer, None).expect("step");
    assert_eq!(report.rollouts, 12);
    assert!(report.reward_mean == 0.0, "the untrained model solves nothing: {report:?}");
    let pg = report.policy_gradient.as_ref().expect("a policy-gradient report");
    assert_eq!((pg.groups, pg.zero_signal_groups), (3, 3));
    assert_eq!((report.examples, report.updates), (0, 0));
    assert!(journal.mini_batches.is_empty());
    assert_eq!(s.trainer.state().step, 0);
    assert_eq!(weights(&s.trainer), before, "bit for bit");
}

/// Chess mates in one under `chess/legal-moves`: the untrained model names no legal move, so
/// the harness plays a seeded random one and some rollouts of a puzzle mate while others do not.
fn chess_setup() -> (Vec<whale_core::Task>, Environment) {
    let tasks = task_domain(Domain::Chess).generate(16, 5, 1);
    let environment = Environment::for_tasks(Domain::Chess, &tasks).expect("environment");
    (tasks, environment)
}

#[test]
fn a_grpo_step_learns_from_the_sampled_tokens_of_tasks_with_spread_and_replays_exactly() {
    let policy = Arc::new(common::tiny_policy());
    let config = grpo(8);
    let pad = policy.tokenizer().specials().endoftext;
    let mut trainer = SftTrainer::new(
        policy.served_model::<Qwen3Model>("the test").expect("a Qwen3 model"),
        trainer_config(&config, pad),
    )
    .expect("trainer");
    let start = weights(&trainer);
    let (tasks, environment) = chess_setup();
    let sampling = SamplingParams { max_tokens: 8, ..SamplingParams::default() };
    let limits = Limits::default();
    let phase = phase(&config, &environment, &tasks, &sampling, &limits);
    let harness = stock_harness("chess/legal-moves").expect("stock").harness();
    let (report, journal, _) = phase.step(1, &[harness], &policy, &mut trainer, None).expect("step");
    let pg = report.policy_gradient.clone().expect("a policy-gradient report");
    assert_eq!(pg.groups, 8);
    assert!(pg.zero_signal_groups < 8, "some puzzle's rollouts differ: {report:?}");
    assert_eq!(report.updates, 1, "one mini-batch holds the step");
    assert_eq!(pg.clip_fraction, Some(0.0), "on-policy: nothing clipped");
    assert_eq!(pg.ratio_deviation, Some(0.0), "the first update is on-policy: ratio 1");
    assert!(pg.sampler_deviation.expect("measured") < 1e-3, "the engine and the trainer agree: {pg:?}");
    assert!(pg.advantage_mean.abs() < pg.advantage_abs_mean, "advantages of both signs: {pg:?}");
    let examples: Vec<_> = journal.mini_batches.iter().flatten().collect();
    assert_eq!(examples.len(), report.examples);
    for example in &examples {
        assert_eq!(example.behaviour.len(), example.completion.len(), "a log-probability per sampled token");
        assert!(example.advantage.is_some(), "every example carries its rollout's advantage");
    }
    assert_eq!(report.trained_tokens, examples.iter().map(|e| e.completion.len()).sum::<usize>());
    let trained = weights(&trainer);
    assert_ne!(trained, start);

    // A resumed run replays the journal onto the same starting weights.
    let other = Arc::new(common::tiny_policy());
    let mut replay = SftTrainer::new(
        other.served_model::<Qwen3Model>("the test").expect("a Qwen3 model"),
        trainer_config(&config, pad),
    )
    .expect("trainer");
    assert_eq!(weights(&replay), start);
    let journal: whale_loop::weight_phase::StepJournal =
        serde_json::from_str(&serde_json::to_string(&journal).expect("json")).expect("journal");
    apply(&mut replay, &journal, &config).expect("replay");
    assert_eq!(weights(&replay), trained, "bit for bit");
}
