// The plain starting point of the math search: the pretraining corpus's default prompt (the
// question, then "Give the final answer after ####."), one model call, and the reply's last
// line as the answer. Nothing checks the arithmetic or reads the answer carefully.
export const meta = {
  name: "plain",
  description: "one call with the default prompt; submits the reply's last line",
};

export function solve(task, ctx) {
  const reply = ctx.llm.chat(`${ctx.env.observation}\nGive the final answer after ####.`, { max_tokens: 256 });
  const lines = reply.text.trim().split("\n");
  return lines[lines.length - 1];
}
