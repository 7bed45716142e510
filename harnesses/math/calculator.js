// A calculator tool loop in the protocol of the pretraining corpus: the model writes one
// `CALC: <expression>` per step, the harness evaluates it exactly with the calculator tool and
// answers `RESULT: <value>`, until the model gives the final answer after ####. The model
// plans the steps; the tool does the arithmetic it would get wrong.
export const meta = {
  name: "calculator",
  description: "CALC:/RESULT: tool loop with the exact calculator; answer after ####",
};

const INSTRUCTION =
  "You can use a calculator. To use it, reply with one line `CALC: <expression>` and wait for " +
  "`RESULT: <value>`. When you are done, give the final answer after ####.";
const MAX_TURNS = 8;

function finalAnswer(text) {
  const match = text.match(/####\s*([^\n]*)/);
  return match && match[1].trim() !== "" ? match[1].trim() : null;
}

function calculation(text) {
  const match = text.match(/CALC:\s*([^\n]+)/);
  return match ? match[1].replace(/[$,]/g, "").replace(/[=.\s]+$/, "").trim() : null;
}

function lastNumber(text) {
  const numbers = text.replace(/,/g, "").match(/-?\d+(?:\.\d+)?(?:\/\d+)?/g);
  return numbers ? numbers[numbers.length - 1] : null;
}

/** The calculator's exact value, or null when it refuses the expression. */
function evaluate(ctx, expression) {
  try {
    return String(ctx.tools.calculator(expression)).split(" ≈ ")[0];
  } catch (error) {
    ctx.log(`calculator refused ${JSON.stringify(expression)}: ${error.message}`);
    return null;
  }
}

export function solve(task, ctx) {
  const messages = [
    { role: "system", content: INSTRUCTION },
    { role: "user", content: ctx.env.observation },
  ];
  let lastResult = null;
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    let reply;
    try {
      reply = ctx.llm.chat(messages, { max_tokens: 64, stop: ["RESULT:"] });
    } catch (error) {
      ctx.log(`model call refused: ${error.message}`);
      break;
    }
    const answer = finalAnswer(reply.text);
    if (answer !== null) return answer;
    const expression = calculation(reply.text);
    if (expression === null) return lastNumber(reply.text) ?? lastResult ?? undefined;
    const value = evaluate(ctx, expression);
    lastResult = value ?? lastResult;
    messages.push({ role: "assistant", content: reply.text.trim() });
    messages.push({ role: "user", content: `RESULT: ${value ?? "error"}` });
  }
  return lastResult ?? undefined;
}
