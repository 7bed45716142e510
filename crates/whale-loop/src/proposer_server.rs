//! The agent proposer's own model, served by the run: `[search.agent] local_model` names a model
//! (Qwen2.5-Coder-1.5B-Instruct, say) that the run loads into a `whale serve` of its own on a
//! free loopback port for each proposal, points the proposer at, and stops once the proposal is
//! made.
//!
//! Why in-process rather than a second terminal: a run that needs another process started by
//! hand first is one a killed run cannot resume by itself; here the server comes and goes with
//! the run. Why only for the length of a proposal: the model's weights (about 7 GiB for the 1.5B
//! in f32) would otherwise sit beside the policy's weight steps and evaluations, where a run of
//! the 0.5B peaked at 22.5 GiB with them on a 24 GB machine; loading them again takes seconds
//! against minutes of proposing.

use std::path::{Path, PathBuf};
use whale_engine::EngineConfig;
use whale_search::{
    agent_proposer_name, AgentConfig, AgentProposer, Proposal, ProposalContext, Proposer, ProposerError, TokenUsage,
};
use whale_serve::{LoadSettings, ModelRegistry, ServeConfig, Server};

/// The agent proposer whose model is served for each proposal.
pub struct ServedAgent {
    config: AgentConfig,
    /// The checkpoint directory of `config.local_model`.
    dir: PathBuf,
    /// The tokens of every proposal so far (each talked to a server of its own).
    spent: TokenUsage,
}

impl ServedAgent {
    /// Checks the config; the model is loaded and served at each proposal. `local_model` must be
    /// a checkpoint directory by now (the run's config loader converts a GGUF or a fetched
    /// model's name first).
    pub fn start(config: &AgentConfig) -> Result<Self, ProposerError> {
        let dir = config.local_model.as_deref().ok_or_else(|| ProposerError::Config("no local_model".into()))?;
        if config.base_url.is_some() {
            return Err(ProposerError::Config(
                "[search.agent] has both base_url and local_model: a local model is served by the run itself".into(),
            ));
        }
        if !dir.join("config.json").is_file() {
            return Err(ProposerError::Config(format!(
                "[search.agent] local_model {}: no config.json there (not a checkpoint directory)",
                dir.display()
            )));
        }
        Ok(Self { config: config.clone(), dir: dir.to_path_buf(), spent: TokenUsage::default() })
    }

    /// Serves the model on `127.0.0.1` (any free port) and makes the proposer that talks to it;
    /// dropping the server stops it and frees the model. A model that does not load, or a server
    /// that does not start, is the run's infrastructure failing ([`ProposerError::Server`]).
    fn serve(&self) -> Result<(AgentProposer, Server), ProposerError> {
        let name = self.config.model.clone().unwrap_or_else(|| served_name(&self.dir));
        let settings = LoadSettings { engine: proposer_engine(), ..LoadSettings::default() };
        let registry = ModelRegistry::open(&self.dir, Some(name.clone()), settings)
            .map_err(|e| ProposerError::Server(format!("[search.agent] local_model {}: {e}", self.dir.display())))?;
        let serve = ServeConfig { host: "127.0.0.1".into(), port: 0, ..ServeConfig::default() };
        let server = Server::start(&serve, registry)
            .map_err(|e| ProposerError::Server(format!("cannot serve the proposer's model: {e}")))?;
        let agent = AgentConfig { base_url: Some(server.base_url()), model: Some(name), ..self.config.clone() };
        Ok((AgentProposer::new(agent)?, server))
    }
}

/// The engine of the proposer's model. A session's prompt is the system prompt (the search rules
/// and the harness API, about 6,000 tokens for Qwen2.5) and grows with every turn, so the context
/// is the model's own (capped at 32,768 tokens) rather than the engine's 4,096, and each turn
/// starts from the cache of the conversation so far instead of prefilling it again.
fn proposer_engine() -> EngineConfig {
    EngineConfig {
        max_context: PROPOSER_CONTEXT,
        max_prefill_tokens: 2048,
        prefix_cache_tokens: PROPOSER_CONTEXT,
        ..EngineConfig::default()
    }
}

/// Most tokens of a proposer session's conversation (the model's own limit may be lower).
const PROPOSER_CONTEXT: usize = 32_768;

/// The name the proposer's model is served under: its directory's last component.
fn served_name(dir: &Path) -> String {
    dir.file_name().map_or_else(|| "proposer".to_string(), |name| name.to_string_lossy().into_owned())
}

impl Proposer for ServedAgent {
    fn name(&self) -> &str {
        agent_proposer_name(self.config.one_shot)
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        let (mut proposer, server) = self.serve()?;
        let proposals = proposer.propose(ctx);
        self.spent.add(proposer.usage());
        drop(server);
        proposals
    }

    fn usage(&self) -> TokenUsage {
        self.spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint directory whose weights do not load: the run starts (only the directory is
    /// checked then), and serving it for a proposal fails as infrastructure, which stops the
    /// search rather than counting as a proposal that failed.
    #[test]
    fn a_model_that_does_not_load_at_a_proposal_is_an_infrastructure_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = AgentConfig { local_model: Some(dir.path().to_path_buf()), ..AgentConfig::default() };
        let error = ServedAgent::start(&config).err().expect("no config.json");
        assert!(error.to_string().contains("config.json") && !error.is_infrastructure(), "{error}");
        std::fs::write(dir.path().join("config.json"), "{ not json").expect("write");
        let served = ServedAgent::start(&config).expect("a checkpoint directory, by its config.json");
        let error = served.serve().err().expect("the weights do not load");
        assert!(matches!(error, ProposerError::Server(_)) && error.is_infrastructure(), "{error}");
    }
}
