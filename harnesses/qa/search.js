// Search, then answer: the question itself is the BM25 query, and the top passages go into
// the corpus's "Answer the question using the passages." prompt. The short answer is the first
// line of the reply, stripped of an "Answer:" prefix and trailing punctuation.
export const meta = {
  name: "search",
  description: "search the question (top 3), answer from the passages",
};

function passages(hits) {
  return hits.map((hit) => `[${hit.title}] ${hit.text}`).join("\n");
}

function shortAnswer(text) {
  const line = text.trim().split("\n")[0] ?? "";
  return line.replace(/^(answer|a)\s*:\s*/i, "").replace(/[.\s]+$/, "").trim();
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const hits = ctx.tools.search(question, 3);
  const prompt = `Answer the question using the passages.\n${passages(hits)}\nQuestion: ${question}`;
  try {
    return shortAnswer(ctx.llm.chat(prompt, { max_tokens: 32 }).text);
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return undefined;
  }
}
