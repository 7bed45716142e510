// For an instruct model: three worked GSM8K train-split problems as earlier chat turns, each a
// few short lines of arithmetic ending in `#### <answer>`, then the task. The answer is read
// after ####; a reply without one gets a second, untrained call that asks for the number alone
// (small instruct models reason when asked for only a number, so the format is shown, not told).
export const meta = {
  name: "fewshot",
  description: "three worked train-split examples as chat turns; answer after ####, else asked for",
};

const EXAMPLES = [
  [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72",
  ],
  [
    "Tim has 30 less apples than Martha, and Harry has half as many apples as Tim. If Martha has 68 apples, how many apples does Harry have?",
    "Tim has 68-30 = 38 apples.\nHarry has 38/2 = 19 apples.\n#### 19",
  ],
  [
    "A boxer weighs 97 kg at 4 months from a fight. He is on a diet that allows him to lose 3 kg per month until the day of the fight. How much will he weigh on the day of the fight?",
    "In 4 months, he will lose 3 x 4 = 12 kilograms.\nSo his weight will be 97 - 12 = 85 kilograms.\n#### 85",
  ],
];

const INSTRUCTION = "Solve the problem in a few short lines. End with the final answer after ####.";

function finalAnswer(text) {
  const match = text.match(/####\s*\$?\s*(-?[\d,]*\.?\d+)/);
  return match ? match[1].replace(/,/g, "") : null;
}

function lastNumber(text) {
  const numbers = text.replace(/,/g, "").match(/-?\d+(?:\.\d+)?/g);
  return numbers ? numbers[numbers.length - 1] : null;
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
  const messages = [{ role: "system", content: INSTRUCTION }];
  for (const [question, solution] of EXAMPLES) {
    messages.push({ role: "user", content: question }, { role: "assistant", content: solution });
  }
  messages.push({ role: "user", content: ctx.env.observation });
  const reply = chat(ctx, messages, { max_tokens: 160 });
  if (reply === null) return undefined;
  const answer = finalAnswer(reply);
  if (answer !== null) return answer;
  messages.push({ role: "assistant", content: reply.trim() });
  messages.push({ role: "user", content: "What is the final answer? Reply with the number only." });
  const number = chat(ctx, messages, { max_tokens: 12, trainable: false });
  return lastNumber(number ?? "") ?? lastNumber(reply) ?? undefined;
}
