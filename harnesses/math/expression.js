// For a small instruct model that plans arithmetic but gets the sums wrong: worked examples
// (GSM8K train-split problems) show a problem turned into one arithmetic expression over its
// numbers; the model writes the expression for the task, and the calculator tool evaluates it
// exactly. A reply with no expression the calculator accepts falls back to its last number.
export const meta = {
  name: "expression",
  description: "worked examples turn a problem into one expression; the calculator evaluates it",
};

const EXAMPLES = [
  [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
    "48 + 48 / 2",
  ],
  [
    "Tim has 30 less apples than Martha, and Harry has half as many apples as Tim. If Martha has 68 apples, how many apples does Harry have?",
    "(68 - 30) / 2",
  ],
  [
    "A boxer weighs 97 kg at 4 months from a fight. He is on a diet that allows him to lose 3 kg per month until the day of the fight. How much will he weigh on the day of the fight?",
    "97 - 3 * 4",
  ],
  [
    "John writes 20 pages a day.  How long will it take him to write 3 books that are 400 pages each?",
    "3 * 400 / 20",
  ],
];

const INSTRUCTION =
  "Write one arithmetic expression that computes the answer, using the numbers in the problem " +
  "and + - * / and parentheses. Reply with the expression only.";

function expressionOf(text) {
  const line = (text.split("\n").find((l) => /\d/.test(l)) ?? "")
    .replace(/[$,]/g, "")
    .replace(/[x×]/g, "*")
    .replace(/÷/g, "/")
    .replace(/^[^\d(]*/, "")
    .replace(/=.*$/, "")
    .replace(/[^\d()+\-*/.\s]+$/, "")
    .trim();
  return line === "" ? null : line;
}

function lastNumber(text) {
  const numbers = text.replace(/,/g, "").match(/-?\d+(?:\.\d+)?/g);
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
  const messages = [{ role: "system", content: INSTRUCTION }];
  for (const [question, expression] of EXAMPLES) {
    messages.push({ role: "user", content: question }, { role: "assistant", content: expression });
  }
  messages.push({ role: "user", content: ctx.env.observation });
  let reply;
  try {
    reply = ctx.llm.chat(messages, { max_tokens: 48, stop: ["\n\n"] }).text;
  } catch (error) {
    ctx.log(`model call refused: ${error.message}`);
    return undefined;
  }
  const expression = expressionOf(reply);
  const value = expression === null ? null : evaluate(ctx, expression);
  return value ?? lastNumber(reply) ?? undefined;
}
