// Self-consistency: several independently sampled solutions to the default prompt, the final
// answer read from each with a careful parser (####, \boxed{}, "the answer is", else the last
// number), and the most common answer submitted. Sampling noise that scatters wrong answers
// rarely outvotes a model that is right more often than not.
export const meta = {
  name: "vote",
  description: "5 sampled solutions, answers parsed carefully, majority vote",
};

const SAMPLES = 5;

function extractAnswer(text) {
  const patterns = [/####\s*([^\n]+)/, /\\boxed\{([^{}]+)\}/, /answer is\s*:?\s*\$?([^\s$]+)/i];
  for (const pattern of patterns) {
    const match = text.match(pattern);
    if (match) return normalize(match[1]);
  }
  const numbers = text.replace(/,/g, "").match(/-?\d+(?:\.\d+)?(?:\/\d+)?/g);
  return numbers ? normalize(numbers[numbers.length - 1]) : null;
}

/** The same number spelt the same way: no separators, units or trailing zeros. */
function normalize(answer) {
  let text = answer.replace(/[,$]/g, "").replace(/\.$/, "").trim();
  if (/^-?\d+\.\d+$/.test(text)) text = text.replace(/0+$/, "").replace(/\.$/, "");
  return text === "" ? null : text;
}

export function solve(task, ctx) {
  const prompt = `${ctx.env.observation}\nGive the final answer after ####.`;
  const counts = new Map();
  let best = null;
  for (let i = 0; i < SAMPLES; i++) {
    let reply;
    try {
      reply = ctx.llm.chat(prompt, { max_tokens: 256 });
    } catch (error) {
      ctx.log(`model call refused: ${error.message}`);
      break;
    }
    const answer = extractAnswer(reply.text);
    if (answer === null) continue;
    counts.set(answer, (counts.get(answer) ?? 0) + 1);
    if (best === null || counts.get(answer) > counts.get(best)) best = answer;
  }
  ctx.log("votes", Object.fromEntries(counts));
  return best ?? undefined;
}
