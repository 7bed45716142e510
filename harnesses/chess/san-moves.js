// The legal moves in SAN, in the corpus's SAN puzzle dialogue: SAN marks a check with `+` and
// a mate with `#`, which the UCI list does not show. The first legal move named in a reply is
// played; a reply naming none is sampled once more, and if that fails too a legal move is
// drawn at random rather than losing to an illegal one.
export const meta = {
  name: "san-moves",
  description: "FEN + legal moves in SAN (checks and mates marked) in a multi-turn dialogue",
};

/** The documented default of `model_calls`: the harness spreads its calls within it. */
const CALL_BUDGET = 16;

function goal(task) {
  const mate = (task.themes ?? []).find((theme) => /^mateIn\d$/.test(theme));
  return mate ? `mate in ${mate.slice(6)}` : "win";
}

/** The first word of `text` that names a legal move, in SAN or UCI, as UCI. */
function legalMoveIn(text, legal) {
  for (const word of text.split(/[\s,.;:!?()]+/)) {
    const san = legal.san.indexOf(word);
    if (san >= 0) return legal.uci[san];
    const uci = legal.uci.indexOf(word.toLowerCase());
    if (uci >= 0) return legal.uci[uci];
  }
  return null;
}

function chat(ctx, messages) {
  try {
    return ctx.llm.chat(messages, { max_tokens: 8, stop: ["\n"] }).text;
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return null;
  }
}

export function solve(task, ctx) {
  const messages = [];
  let calls = 0;
  while (!ctx.env.done) {
    const legal = ctx.tools.legal_moves();
    const opening =
      messages.length === 0
        ? `Chess puzzle: ${ctx.tools.side_to_move()} to move and ${goal(task)}.`
        : `The opponent replied ${ctx.tools.last_move().uci}.`;
    messages.push({
      role: "user",
      content: `${opening}\nFEN: ${ctx.tools.fen()}\nLegal moves (SAN): ${legal.san.join(" ")}\nReply with the best move in SAN.`,
    });
    let move = null;
    for (let attempt = 0; attempt < 2 && move === null && calls < CALL_BUDGET; attempt++) {
      calls++;
      const reply = chat(ctx, messages);
      move = reply === null ? null : legalMoveIn(reply, legal);
    }
    if (move === null) {
      move = legal.uci[Math.floor(ctx.random() * legal.uci.length)];
      ctx.log(`no legal move in the replies; playing ${move}`);
    }
    messages.push({ role: "assistant", content: legal.san[legal.uci.indexOf(move)] });
    ctx.env.play(move);
  }
}
