// Majority over moves: for each move, several replies sampled from the legal-moves prompt,
// each read as a legal move, and the most common one played. The samples per move shrink so
// that the whole puzzle fits the model-call budget however many moves it takes.
export const meta = {
  name: "vote",
  description: "up to 3 sampled legal-moves replies per move; plays the most common legal move",
};

const CALL_BUDGET = 16;
const SAMPLES = 3;

function goal(task) {
  const mate = (task.themes ?? []).find((theme) => /^mateIn\d$/.test(theme));
  return mate ? `mate in ${mate.slice(6)}` : "win";
}

function legalMoveIn(text, legal) {
  for (const word of text.split(/[\s,.;:!?()]+/)) {
    const uci = legal.uci.indexOf(word.toLowerCase());
    if (uci >= 0) return legal.uci[uci];
    const san = legal.san.indexOf(word);
    if (san >= 0) return legal.uci[san];
  }
  return null;
}

export function solve(task, ctx) {
  let calls = 0;
  let movesLeft = Math.max(1, task.solver_moves ?? 1);
  let opening = `Chess puzzle: ${ctx.tools.side_to_move()} to move and ${goal(task)}.`;
  while (!ctx.env.done) {
    const legal = ctx.tools.legal_moves();
    const prompt = `${opening}\nFEN: ${ctx.tools.fen()}\nLegal moves: ${legal.uci.join(" ")}\nReply with the best move in UCI.`;
    const samples = Math.max(1, Math.min(SAMPLES, Math.floor((CALL_BUDGET - calls) / movesLeft)));
    const counts = new Map();
    let best = null;
    for (let i = 0; i < samples && calls < CALL_BUDGET; i++) {
      calls++;
      let move = null;
      try {
        move = legalMoveIn(ctx.llm.chat(prompt, { max_tokens: 8, stop: ["\n"] }).text, legal);
      } catch (error) {
        ctx.log(`model call refused: ${error.message}`);
      }
      if (move === null) continue;
      counts.set(move, (counts.get(move) ?? 0) + 1);
      if (best === null || counts.get(move) > counts.get(best)) best = move;
    }
    const move = best ?? legal.uci[Math.floor(ctx.random() * legal.uci.length)];
    ctx.env.play(move);
    movesLeft = Math.max(1, movesLeft - 1);
    opening = `The opponent replied ${ctx.tools.last_move().uci}.`;
  }
}
