// For an instruct model: the top four passages of a search on the question, each under its
// title, after three worked one-hop examples as chat turns (a person's birth year, a company's
// chief executive, a city's population), each answered with the bare phrase. The reply's first
// line is the answer, cut at the first full stop; nothing is asked twice.
export const meta = {
  name: "fewshot",
  description: "search (top 4), titled passages, three one-hop examples as turns; the first line",
};

const SYSTEM = "Answer each question from its passages with the answer phrase alone.";

const EXAMPLES = [
  {
    passages: [
      ["Marta Keller", "Marta Keller (born 1962 in Lyon) is a chemist. Keller founded Keller Optics in 1990."],
      ["Lyon", "Lyon is a city that was founded in 43 BC; its population is 522,000."],
    ],
    question: "In what year was Marta Keller born?",
    answer: "1962",
  },
  {
    passages: [
      ["Brightwater Foods", "Brightwater Foods was established in 1971 by Tom Reyes. Its current CEO is Ana Lindqvist."],
      ["Tom Reyes", "Tom Reyes is a baker. Reyes was born in 1935 in the city of Porto."],
    ],
    question: "Who is the CEO of Brightwater Foods?",
    answer: "Ana Lindqvist",
  },
  {
    passages: [
      ["Porto", "Founded in 300 BC, Porto is a city of 231,800 inhabitants."],
      ["Ana Lindqvist", "Born in Porto in 1968, Ana Lindqvist became a well-known economist."],
    ],
    question: "What is the population of Porto?",
    answer: "231,800",
  },
];

function prompt(passages, question) {
  const lines = passages.map(([title, text]) => `[${title}] ${text}`).join("\n");
  return `Passages:\n${lines}\nQuestion: ${question}`;
}

function firstPhrase(reply) {
  const line = reply.trim().split("\n")[0] ?? "";
  return line.split(/\.(\s|$)/)[0].replace(/^(the\s+)?answer(\s+is)?\s*:?\s*/i, "").trim();
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const hits = ctx.tools.search(question, 4).map((hit) => [hit.title, hit.text]);
  const messages = [{ role: "system", content: SYSTEM }];
  for (const example of EXAMPLES) {
    messages.push({ role: "user", content: prompt(example.passages, example.question) });
    messages.push({ role: "assistant", content: example.answer });
  }
  messages.push({ role: "user", content: prompt(hits, question) });
  return firstPhrase(ctx.llm.chat(messages, { max_tokens: 24 }).text);
}
