// The plain starting point of the chess search: for each move, the episode's observation (the
// position as FEN and board) and "Reply with your move in UCI", one model call, and the
// reply's first word played as it is, legal or not.
export const meta = {
  name: "plain",
  description: "one call per move on the observation; plays the reply's first word",
};

export function solve(task, ctx) {
  while (!ctx.env.done) {
    const reply = ctx.llm.chat(`${ctx.env.observation}\nReply with your move in UCI (like e2e4).`, {
      max_tokens: 8,
    });
    ctx.env.play(reply.text.trim().split(/\s+/)[0]);
  }
}
