// The plain starting point of the QA search: the question alone, one model call, and the
// reply's first line as the answer. It never searches, so it can only answer what the model
// happens to know.
export const meta = {
  name: "plain",
  description: "one call on the bare question, no search; submits the first line",
};

export function solve(task, ctx) {
  const reply = ctx.llm.chat(ctx.env.observation, { max_tokens: 32 });
  return reply.text.trim().split("\n")[0];
}
