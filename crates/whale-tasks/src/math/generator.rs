//! Synthetic arithmetic word problems at graded difficulty.
//!
//! The embedded default model is tiny; online RFT only learns from problems it sometimes
//! solves, so it needs a supply of problems whose difficulty can be dialled. Each problem is
//! a short story from one of several templates (a collection that grows and shrinks, a
//! shopping trip, a week of production, a savings plan). Difficulty `d` (1..=5) sets the
//! number of arithmetic steps (`d + 1`, one more for shopping from `d = 2`) and the size of
//! the numbers. The generator computes every intermediate value itself and writes a worked
//! solution, one `description: expression = value.` line per step, ending with `#### answer`.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub const MIN_DIFFICULTY: u32 = 1;
pub const MAX_DIFFICULTY: u32 = 5;

/// Largest operand per difficulty level (index `d - 1`).
const OPERAND_LIMITS: [i64; 5] = [10, 20, 50, 100, 500];

const NAMES: &[&str] = &[
    "Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Keiko", "Liam", "Maya", "Noah",
    "Olga", "Priya",
];

/// How hard a problem is: how many steps, how large the numbers.
#[derive(Debug, Clone, Copy)]
struct Scale {
    steps: usize,
    max: i64,
}

impl Scale {
    fn of(difficulty: u32) -> Self {
        let d = difficulty.clamp(MIN_DIFFICULTY, MAX_DIFFICULTY);
        let index = usize::try_from(d - 1).unwrap_or(0);
        Scale { steps: index + 2, max: OPERAND_LIMITS[index] }
    }
}

/// One line of the worked solution.
#[derive(Debug, Clone)]
struct Step {
    description: String,
    expression: String,
    value: i64,
}

/// A generated problem: the question and its worked steps; the answer is the last value.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) template: &'static str,
    pub(crate) question: String,
    steps: Vec<Step>,
}

impl Problem {
    pub(crate) fn answer(&self) -> i64 {
        self.steps.last().map_or(0, |s| s.value)
    }

    pub(crate) fn solution(&self) -> String {
        let mut lines: Vec<String> = self
            .steps
            .iter()
            .map(|s| format!("{}: {} = {}.", capitalized(&s.description), s.expression, s.value))
            .collect();
        lines.push(format!("#### {}", self.answer()));
        lines.join("\n")
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

type Template = fn(&mut ChaCha8Rng, Scale) -> Problem;

const TEMPLATES: [Template; 4] = [collection, shopping, production, savings];

/// The `index`-th problem of the stream for `seed`, independent of every other index.
pub(crate) fn problem(seed: u64, index: u64, difficulty: u32) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    let template = TEMPLATES[rng.gen_range(0..TEMPLATES.len())];
    template(&mut rng, Scale::of(difficulty))
}

/// Collects sentences and steps; the question asked is the one of the last stage pushed.
struct Story {
    sentences: Vec<String>,
    steps: Vec<Step>,
    question: String,
}

impl Story {
    fn new(opening: String) -> Self {
        Story { sentences: vec![opening], steps: Vec::new(), question: String::new() }
    }

    fn step_count(&self) -> usize {
        self.steps.len()
    }

    fn tell(&mut self, sentence: String) {
        self.sentences.push(sentence);
    }

    fn compute(&mut self, description: impl Into<String>, expression: String, value: i64) -> i64 {
        self.steps.push(Step { description: description.into(), expression, value });
        value
    }

    fn ask(&mut self, question: String) {
        self.question = question;
    }

    fn finish(self, template: &'static str) -> Problem {
        let mut question = self.sentences.join(" ");
        question.push(' ');
        question.push_str(&self.question);
        Problem { template, question, steps: self.steps }
    }
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, items: &[T]) -> T {
    *items.choose(rng).expect("template tables are never empty")
}

fn two_names(rng: &mut ChaCha8Rng) -> (&'static str, &'static str) {
    let chosen: Vec<&&str> = NAMES.choose_multiple(rng, 2).collect();
    (*chosen[0], *chosen[1])
}

/// A collection of things that grows and shrinks; every step is one random operation.
#[derive(Clone, Copy)]
struct Collectible {
    items: &'static str,
    gains: [&'static str; 2],
    losses: [&'static str; 2],
}

const COLLECTIBLES: [Collectible; 4] = [
    Collectible {
        items: "marbles",
        gains: ["{name} wins {k} more marbles in a game.", "{friend} gives {name} {k} marbles."],
        losses: ["{name} gives {k} marbles to {friend}.", "{name} loses {k} marbles at the park."],
    },
    Collectible {
        items: "stickers",
        gains: ["{name} buys {k} more stickers.", "{friend} gives {name} {k} stickers."],
        losses: ["{name} uses {k} stickers to decorate a notebook.", "{name} trades {k} stickers away."],
    },
    Collectible {
        items: "seashells",
        gains: ["{name} finds {k} more seashells on the beach.", "{friend} gives {name} {k} seashells."],
        losses: ["{k} of the seashells break.", "{name} gives {k} seashells to {friend}."],
    },
    Collectible {
        items: "cookies",
        gains: ["{name} bakes {k} more cookies.", "{friend} brings {name} {k} cookies."],
        losses: ["{name} eats {k} of the cookies.", "{name} gives {k} cookies to {friend}."],
    },
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    Gain,
    Loss,
    Multiply,
    Split,
}

fn collection(rng: &mut ChaCha8Rng, scale: Scale) -> Problem {
    let theme = pick(rng, &COLLECTIBLES);
    let (name, friend) = two_names(rng);
    let items = theme.items;
    let mut count = rng.gen_range(scale.max / 2 + 3..=scale.max * 2);
    let mut story = Story::new(format!("{name} has {count} {items}."));
    let fill =
        |text: &str, k: i64| text.replace("{name}", name).replace("{friend}", friend).replace("{k}", &k.to_string());
    while story.step_count() < scale.steps {
        let divisors: Vec<i64> = (2..=9).filter(|k| count % k == 0 && count >= 2 * k).collect();
        let mut changes = vec![Change::Gain, Change::Multiply];
        if count >= 2 {
            changes.push(Change::Loss);
        }
        if !divisors.is_empty() {
            changes.push(Change::Split);
        }
        count = match pick(rng, &changes) {
            Change::Gain => {
                let k = rng.gen_range(1..=scale.max);
                story.tell(fill(pick(rng, &theme.gains), k));
                story.compute(format!("{name} gets {k} more {items}"), format!("{count} + {k}"), count + k)
            }
            Change::Loss => {
                let k = rng.gen_range(1..=(count - 1).min(scale.max));
                story.tell(fill(pick(rng, &theme.losses), k));
                story.compute(format!("{name} has {k} fewer {items}"), format!("{count} - {k}"), count - k)
            }
            Change::Multiply => {
                let k = rng.gen_range(2..=4);
                story.tell(format!("Then the number of {items} {name} has becomes {k} times as large."));
                story.compute(format!("{k} times as many {items}"), format!("{count} * {k}"), count * k)
            }
            Change::Split => {
                let k = pick(rng, &divisors);
                story.tell(format!("{name} splits the {items} into {k} equal piles and keeps one pile."));
                story.compute(format!("One of {k} equal piles"), format!("{count} / {k}"), count / k)
            }
        };
    }
    story.ask(format!("How many {items} does {name} have now?"));
    story.finish("collection")
}

/// A store and the things it sells (plural names).
#[derive(Clone, Copy)]
struct Store {
    name: &'static str,
    goods: [&'static str; 5],
}

const STORES: [Store; 4] = [
    Store { name: "bakery", goods: ["muffins", "bagels", "croissants", "loaves of bread", "pies"] },
    Store { name: "stationery store", goods: ["notebooks", "pens", "folders", "markers", "rulers"] },
    Store {
        name: "garden center",
        goods: ["plant pots", "seed packets", "bags of soil", "watering cans", "flower bulbs"],
    },
    Store {
        name: "grocery store",
        goods: ["bags of apples", "cartons of milk", "boxes of cereal", "jars of jam", "bags of rice"],
    },
];

/// Buys one kind of good per difficulty level and asks for the change.
fn shopping(rng: &mut ChaCha8Rng, scale: Scale) -> Problem {
    let store = pick(rng, &STORES);
    let (name, _) = two_names(rng);
    let kinds = (scale.steps - 1).min(store.goods.len());
    let goods: Vec<&&str> = store.goods.choose_multiple(rng, kinds).collect();
    let mut story = Story::new(format!("{name} goes to the {}.", store.name));
    let mut purchases = Vec::new();
    let mut costs = Vec::new();
    for good in goods {
        let quantity = rng.gen_range(2..=scale.steps as i64 + 2);
        let price = rng.gen_range(1..=(scale.max / 2).max(3));
        purchases.push(format!("{quantity} {good} for ${price} each"));
        costs.push(story.compute(format!("Cost of the {good}"), format!("{quantity} * {price}"), quantity * price));
    }
    let mut total = costs[0];
    if costs.len() > 1 {
        let terms: Vec<String> = costs.iter().map(i64::to_string).collect();
        total = story.compute("Total cost", terms.join(" + "), costs.iter().sum());
    }
    let bill = next_banknote_above(total);
    story.tell(format!("{name} buys {} and pays with ${bill}.", join_list(&purchases)));
    story.compute(format!("Change from ${bill}"), format!("{bill} - {total}"), bill - total);
    story.ask(format!("How many dollars of change does {name} get back?"));
    story.finish("shopping")
}

/// The smallest amount of the form 1, 2 or 5 times a power of ten that exceeds `total`.
fn next_banknote_above(total: i64) -> i64 {
    let mut power = 1i64;
    loop {
        for unit in [1, 2, 5] {
            if unit * power > total {
                return unit * power;
            }
        }
        power *= 10;
    }
}

fn join_list(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{}, and {last}", init.join(", ")),
    }
}

/// A workshop and what it makes.
#[derive(Clone, Copy)]
struct Workshop {
    place: &'static str,
    unit: &'static str,
    units: &'static str,
    makes: &'static str,
    make: &'static str,
}

const WORKSHOPS: [Workshop; 4] = [
    Workshop { place: "bakery", unit: "loaf", units: "loaves", makes: "bakes", make: "bake" },
    Workshop { place: "toy factory", unit: "toy", units: "toys", makes: "makes", make: "make" },
    Workshop { place: "print shop", unit: "poster", units: "posters", makes: "prints", make: "print" },
    Workshop { place: "candle workshop", unit: "candle", units: "candles", makes: "pours", make: "pour" },
];

/// A week of production: daily output, weekly output, sales, revenue, profit, shares.
fn production(rng: &mut ChaCha8Rng, scale: Scale) -> Problem {
    let w = pick(rng, &WORKSHOPS);
    let (rate, hours) = (rng.gen_range(2..=scale.max), rng.gen_range(2..=10));
    let opening = format!("A {} {} {rate} {} every hour and works {hours} hours a day.", w.place, w.makes, w.units);
    let mut story = Story::new(opening);
    let daily = story.compute(format!("{} per day", w.units), format!("{rate} * {hours}"), rate * hours);
    let days = rng.gen_range(2..=7);
    story.tell(format!("It is open {days} days a week."));
    let weekly = story.compute(format!("{} per week", w.units), format!("{daily} * {days}"), daily * days);
    story.ask(format!("How many {} does the {} {} in a week?", w.units, w.place, w.make));
    if story.step_count() == scale.steps {
        return story.finish("production");
    }
    let unsold = rng.gen_range(1..=weekly / 2);
    story.tell(format!("At the end of the week {unsold} {} are still unsold.", w.units));
    let sold = story.compute(format!("{} sold", w.units), format!("{weekly} - {unsold}"), weekly - unsold);
    story.ask(format!("How many {} does it sell in the week?", w.units));
    if story.step_count() == scale.steps {
        return story.finish("production");
    }
    let price = rng.gen_range(2..=(scale.max / 5).max(4));
    story.tell(format!("Each {} sells for ${price}.", w.unit));
    let revenue = story.compute("Dollars from sales", format!("{sold} * {price}"), sold * price);
    story.ask("How many dollars does it take in from sales that week?".into());
    if story.step_count() == scale.steps {
        return story.finish("production");
    }
    let owners = rng.gen_range(2..=6i64.min(revenue - 1));
    let materials = if scale.steps > 4 {
        revenue - owners * rng.gen_range(1..=(revenue - 1) / owners)
    } else {
        rng.gen_range(1..revenue)
    };
    story.tell(format!("Materials for the week cost ${materials}."));
    let profit = story.compute("Profit", format!("{revenue} - {materials}"), revenue - materials);
    story.ask("What is the profit for the week, in dollars?".into());
    if story.step_count() == scale.steps {
        return story.finish("production");
    }
    story.tell(format!("The {} has {owners} owners who split the profit equally.", w.place));
    story.compute("Each owner's share", format!("{profit} / {owners}"), profit / owners);
    story.ask("How many dollars does each owner get?".into());
    story.finish("production")
}

const PURCHASES: [&str; 6] =
    ["a bike helmet", "a video game", "a pair of sneakers", "a board game", "a telescope", "art supplies"];
const CHARITIES: [&str; 3] = ["an animal shelter", "a food bank", "the school library"];

/// A savings plan: weekly savings, a gift, a purchase, a doubling or tripling, a donation, jars.
fn savings(rng: &mut ChaCha8Rng, scale: Scale) -> Problem {
    let (name, relative) = two_names(rng);
    let (weekly, weeks) = (rng.gen_range(2..=scale.max), rng.gen_range(2..=12));
    let mut story = Story::new(format!("{name} saves ${weekly} every week for {weeks} weeks."));
    story.ask(format!("How many dollars does {name} have now?"));
    let mut money = story.compute("Saved", format!("{weekly} * {weeks}"), weekly * weeks);
    let gift = rng.gen_range(1..=scale.max);
    story.tell(format!("Then {relative} gives {name} ${gift} as a birthday present."));
    money = story.compute("After the present", format!("{money} + {gift}"), money + gift);
    if story.step_count() == scale.steps {
        return story.finish("savings");
    }
    let spent = rng.gen_range(1..=money / 2);
    story.tell(format!("{name} spends ${spent} on {}.", pick(rng, &PURCHASES)));
    money = story.compute("After shopping", format!("{money} - {spent}"), money - spent);
    if story.step_count() == scale.steps {
        return story.finish("savings");
    }
    let (factor, verb) = pick(rng, &[(2, "doubles"), (3, "triples")]);
    story.tell(format!("{relative} then {verb} what {name} has left."));
    money = story.compute(format!("After {relative} {verb} it"), format!("{money} * {factor}"), money * factor);
    if story.step_count() == scale.steps {
        return story.finish("savings");
    }
    let jars = rng.gen_range(2..=5i64.min(money - 1));
    let donation =
        if scale.steps > 5 { money - jars * rng.gen_range(1..=(money - 1) / jars) } else { rng.gen_range(1..money) };
    story.tell(format!("{name} donates ${donation} to {}.", pick(rng, &CHARITIES)));
    money = story.compute("After the donation", format!("{money} - {donation}"), money - donation);
    if story.step_count() == scale.steps {
        return story.finish("savings");
    }
    story.tell(format!("{name} splits the rest equally into {jars} jars."));
    story.compute("In each jar", format!("{money} / {jars}"), money / jars);
    story.ask("How many dollars go into each jar?".into());
    story.finish("savings")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_banknote_is_strictly_above() {
        assert_eq!(next_banknote_above(0), 1);
        assert_eq!(next_banknote_above(1), 2);
        assert_eq!(next_banknote_above(37), 50);
        assert_eq!(next_banknote_above(50), 100);
        assert_eq!(next_banknote_above(4999), 5000);
    }

    #[test]
    fn each_template_takes_the_promised_number_of_steps() {
        for difficulty in MIN_DIFFICULTY..=MAX_DIFFICULTY {
            let scale = Scale::of(difficulty);
            for index in 0..40 {
                let mut rng = ChaCha8Rng::seed_from_u64(index);
                for template in TEMPLATES {
                    let problem = template(&mut rng, scale);
                    let expected = match problem.template {
                        "shopping" if scale.steps > 2 => scale.steps + 1,
                        _ => scale.steps,
                    };
                    assert_eq!(problem.steps.len(), expected, "{} at d={difficulty}", problem.template);
                    assert!(problem.steps.iter().all(|s| s.value >= 0), "{}", problem.solution());
                }
            }
        }
    }

    #[test]
    fn difficulty_out_of_range_is_clamped() {
        assert_eq!(Scale::of(0).steps, Scale::of(1).steps);
        assert_eq!(Scale::of(99).max, Scale::of(5).max);
    }
}
