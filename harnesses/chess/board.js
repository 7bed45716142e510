// The board shown: each turn the text board, the side to move and the last move, in the
// corpus's "Find the strongest move." dialogue, answered "Best move: <uci>". A reply that is
// not a legal move is sampled once more with the legal moves listed; failing that, a legal
// move is drawn at random.
export const meta = {
  name: "board",
  description: "text board + last move per turn; one retry with the legal moves listed",
};

const CALL_BUDGET = 16;

function legalMoveIn(text, legal) {
  const named = text.match(/best move:\s*(\S+)/i);
  const words = named ? [named[1], ...text.split(/\s+/)] : text.split(/\s+/);
  for (const raw of words) {
    const word = raw.replace(/[.,;:!?()]+$/, "");
    const uci = legal.uci.indexOf(word.toLowerCase());
    if (uci >= 0) return legal.uci[uci];
    const san = legal.san.indexOf(word);
    if (san >= 0) return legal.uci[san];
  }
  return null;
}

function chat(ctx, messages) {
  try {
    return ctx.llm.chat(messages, { max_tokens: 12, stop: ["\n"] }).text;
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
    const position = `${ctx.tools.board()}\n${ctx.tools.side_to_move()} to move; the last move was ${ctx.tools.last_move().uci}.`;
    messages.push({ role: "user", content: `${position} Find the strongest move.` });
    let move = null;
    if (calls < CALL_BUDGET) {
      calls++;
      const reply = chat(ctx, messages);
      move = reply === null ? null : legalMoveIn(reply, legal);
    }
    if (move === null && calls < CALL_BUDGET) {
      calls++;
      const retry = messages.slice(0, -1).concat({
        role: "user",
        content: `${position}\nLegal moves: ${legal.uci.join(" ")}\nFind the strongest move.`,
      });
      const reply = chat(ctx, retry);
      move = reply === null ? null : legalMoveIn(reply, legal);
    }
    if (move === null) {
      move = legal.uci[Math.floor(ctx.random() * legal.uci.length)];
      ctx.log(`no legal move in the replies; playing ${move}`);
    }
    messages.push({ role: "assistant", content: `Best move: ${move}` });
    ctx.env.play(move);
  }
}
