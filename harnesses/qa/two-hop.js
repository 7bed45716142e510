// Two searches for two-hop questions: the first search is the question itself, shown to the
// model in the corpus's search protocol; a bridge question ("the founder of X") needs a fact
// about the entity that search turns up, so the model may ask one more `SEARCH:` (and for
// bridge and comparison questions is asked to), and then answers from both result lists.
export const meta = {
  name: "two-hop",
  description: "search the question, let the model search once more (bridge/comparison), answer",
};

const INSTRUCTION =
  "You can search a collection of passages. To search, reply with one line `SEARCH: <query>` " +
  "and wait for the RESULTS. Answer with the short answer only.";
const MULTI_HOP = new Set(["bridge", "comparison"]);

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

/** Up to two passages for `query` that the first search did not already show. */
function newPassages(ctx, query, seen) {
  const hits = ctx.tools.search(query, 4);
  const unseen = hits.filter((hit) => !seen.has(hit.title));
  return (unseen.length > 0 ? unseen : hits).slice(0, 2);
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const firstHits = ctx.tools.search(question, 2);
  const messages = [
    { role: "system", content: INSTRUCTION },
    { role: "user", content: question },
    { role: "assistant", content: `SEARCH: ${question}` },
    { role: "user", content: `RESULTS:\n${passages(firstHits)}` },
  ];
  let reply = chat(ctx, messages);
  if (reply === null) return undefined;
  const asked = reply.match(/SEARCH:\s*([^\n]+)/);
  if (asked === null && !MULTI_HOP.has(task.type)) return shortAnswer(reply);
  // Without a query from the model, its draft answer steers the second search.
  const query = asked && asked[1].trim() !== "" ? asked[1].trim() : `${reply.trim()} ${question}`;
  const seen = new Set(firstHits.map((hit) => hit.title));
  messages.push({ role: "assistant", content: `SEARCH: ${query}` });
  messages.push({ role: "user", content: `RESULTS:\n${passages(newPassages(ctx, query, seen))}` });
  reply = chat(ctx, messages);
  if (reply === null) return undefined;
  if (/SEARCH:/.test(reply)) {
    ctx.log("asked for a third search; answering from the first results instead");
    return shortAnswer(chat(ctx, `Answer the question using the passages.\n${passages(firstHits)}\nQuestion: ${question}`) ?? "");
  }
  return shortAnswer(reply);
}
