// Solve, then check: sample a solution, ask the model whether its answer is correct (the
// corpus's "Proposed answer: ... Is the proposed answer correct? Reply yes or no." prompt), and
// submit the first answer it confirms; when none is confirmed, the most common candidate.
// Checks are not trained on: they judge the model's own work.
export const meta = {
  name: "verify",
  description: "up to 4 solutions, each checked by a yes/no call; first confirmed answer, else majority",
};

const ATTEMPTS = 4;

function extractAnswer(text) {
  const patterns = [/####\s*([^\n]+)/, /\\boxed\{([^{}]+)\}/, /answer is\s*:?\s*\$?([^\s$]+)/i];
  for (const pattern of patterns) {
    const match = text.match(pattern);
    if (match) return clean(match[1]);
  }
  const numbers = text.replace(/,/g, "").match(/-?\d+(?:\.\d+)?(?:\/\d+)?/g);
  return numbers ? clean(numbers[numbers.length - 1]) : null;
}

function clean(answer) {
  const text = answer.replace(/[,$]/g, "").replace(/\.$/, "").trim();
  return text === "" ? null : text;
}

function chat(ctx, prompt, opts) {
  try {
    return ctx.llm.chat(prompt, opts).text;
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return null;
  }
}

export function solve(task, ctx) {
  const question = ctx.env.observation;
  const counts = new Map();
  let majority = null;
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    const solution = chat(ctx, `${question}\nGive the final answer after ####.`, { max_tokens: 256 });
    if (solution === null) break;
    const answer = extractAnswer(solution);
    if (answer === null) continue;
    counts.set(answer, (counts.get(answer) ?? 0) + 1);
    if (majority === null || counts.get(answer) > counts.get(majority)) majority = answer;
    const check = `${question}\nProposed answer: ${answer}\nIs the proposed answer correct? Reply yes or no.`;
    const verdict = chat(ctx, check, { max_tokens: 2, temperature: 0, trainable: false });
    if (verdict !== null && /^\s*yes/i.test(verdict)) {
      ctx.log(`confirmed ${answer} on attempt ${attempt + 1}`);
      return answer;
    }
  }
  return majority ?? undefined;
}
