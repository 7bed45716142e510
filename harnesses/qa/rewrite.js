// Rewrite the query: the model, prompted with the corpus's search protocol, writes its own
// query (`SEARCH: <query>`, usually the name of the entity the question is about) instead of
// the raw question, whose extra words dilute BM25. The results come back as `RESULTS:` and
// the model answers; a reply that is not a search falls back to searching the question.
export const meta = {
  name: "rewrite",
  description: "the model writes the search query (SEARCH: protocol), then answers from the results",
};

const INSTRUCTION =
  "You can search a collection of passages. To search, reply with one line `SEARCH: <query>` " +
  "and wait for the RESULTS. Answer with the short answer only.";

function passages(hits) {
  return hits.map((hit) => `[${hit.title}] ${hit.text}`).join("\n");
}

function shortAnswer(text) {
  const line = text.trim().split("\n")[0] ?? "";
  return line.replace(/^(answer|a)\s*:\s*/i, "").replace(/[.\s]+$/, "").trim();
}

function chat(ctx, messages) {
  try {
    return ctx.llm.chat(messages, { max_tokens: 32 }).text;
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return null;
  }
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const messages = [
    { role: "system", content: INSTRUCTION },
    { role: "user", content: question },
  ];
  const first = chat(ctx, messages) ?? "";
  const asked = first.match(/SEARCH:\s*([^\n]+)/);
  const query = asked && asked[1].trim() !== "" ? asked[1].trim() : question;
  messages.push({ role: "assistant", content: `SEARCH: ${query}` });
  messages.push({ role: "user", content: `RESULTS:\n${passages(ctx.tools.search(query, 2))}` });
  const reply = chat(ctx, messages);
  if (reply === null) return undefined;
  const again = reply.match(/SEARCH:\s*([^\n]+)/);
  if (again === null) return shortAnswer(reply);
  ctx.log(`asked for a second search (${again[1]}); answering from the passages instead`);
  const hits = ctx.tools.search(query, 3);
  const prompt = `Answer the question using the passages.\n${passages(hits)}\nQuestion: ${question}`;
  const answer = chat(ctx, prompt);
  return answer === null ? undefined : shortAnswer(answer);
}
