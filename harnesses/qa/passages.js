// For an instruct model: the top four passages of a search on the question, each under its
// title, one worked demonstration turn, and an instruction to answer with the short phrase
// alone. Small instruct models state the answer inside a sentence, so a reply longer than a
// short phrase gets a second, untrained call that asks for the phrase alone.
export const meta = {
  name: "passages",
  description: "search (top 4), titled passages, one demonstration; short answer, else asked for",
};

const INSTRUCTION =
  "Answer the question from the passages. Reply with the answer only: a name, a year, a number " +
  "or a short phrase, with no sentence around it.";

const DEMONSTRATION = [
  "Passages:\n" +
    "[Harbor Bridge] The Harbor Bridge is a steel arch bridge. It was opened in 1932.\n" +
    "[Ella Moray] Ella Moray (born 1951) is a painter. She designed the lamps of the Harbor Bridge.\n" +
    "Question: In what year was the bridge whose lamps Ella Moray designed opened?",
  "1932",
];

const SHORT_WORDS = 6;

function passages(hits) {
  return hits.map((hit) => `[${hit.title}] ${hit.text}`).join("\n");
}

function shortAnswer(text) {
  const line = text.trim().split("\n")[0] ?? "";
  return line
    .replace(/^(the\s+)?answer\s+is\s*:?\s*/i, "")
    .replace(/^(answer|a)\s*:\s*/i, "")
    .replace(/[.\s]+$/, "")
    .trim();
}

function chat(ctx, messages, opts) {
  try {
    return ctx.llm.chat(messages, opts).text;
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return null;
  }
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const hits = ctx.tools.search(question, 4);
  const messages = [
    { role: "system", content: INSTRUCTION },
    { role: "user", content: DEMONSTRATION[0] },
    { role: "assistant", content: DEMONSTRATION[1] },
    { role: "user", content: `Passages:\n${passages(hits)}\nQuestion: ${question}` },
  ];
  const reply = chat(ctx, messages, { max_tokens: 32 });
  if (reply === null) return undefined;
  const answer = shortAnswer(reply);
  if (answer.split(/\s+/).length <= SHORT_WORDS) return answer;
  messages.push({ role: "assistant", content: reply.trim() });
  messages.push({ role: "user", content: "Give only the short answer, nothing else." });
  const short = chat(ctx, messages, { max_tokens: 16, trainable: false });
  return short === null ? answer : shortAnswer(short);
}
