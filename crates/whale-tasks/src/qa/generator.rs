//! Synthetic multi-hop QA over a fictional knowledge base, for models too small for HotpotQA.
//!
//! People, cities and companies get names built from syllables, so no fact can be recalled from
//! pre-training: the answer has to be found by searching. Each entity is rendered as a passage
//! (templates vary the wording), 1-hop questions ask for one attribute of a named entity and
//! 2-hop questions reach it through a relation ("the founder of X"). Every task carries its
//! supporting passages plus distractors from the same knowledge base as HotpotQA-style
//! context, so the tasks' contexts form their retrieval corpus.

use super::payload::{ContextParagraph, QaPayload, Source};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use whale_core::Task;

/// Paragraphs per task, supporting ones included (HotpotQA's distractor setting uses 10).
const CONTEXT_PARAGRAPHS: usize = 10;
const ONSETS: [&str; 16] = ["b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "z", "th", "dr", "kr", "zh", "qu"];
const VOWELS: [&str; 7] = ["a", "e", "i", "o", "u", "ae", "y"];
const CODAS: [&str; 7] = ["", "n", "r", "l", "x", "th", "sk"];
const COMPANY_KINDS: [&str; 7] = ["Industries", "Works", "Labs", "Holdings", "Systems", "Foundry", "Dynamics"];
const OCCUPATIONS: [&str; 12] = [
    "architect",
    "botanist",
    "cartographer",
    "violinist",
    "glassblower",
    "astronomer",
    "engineer",
    "novelist",
    "sculptor",
    "chemist",
    "beekeeper",
    "lighthouse keeper",
];

struct Person {
    name: String,
    birth_year: u32,
    occupation: &'static str,
    birth_city: usize,
}

struct City {
    name: String,
    population: u32,
    founded: u32,
}

struct Company {
    name: String,
    founded: u32,
    founder: usize,
    ceo: usize,
    headquarters: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Entity {
    Person(usize),
    City(usize),
    Company(usize),
}

struct KnowledgeBase {
    people: Vec<Person>,
    cities: Vec<City>,
    companies: Vec<Company>,
    /// One rendered passage per entity, in the order of [`KnowledgeBase::entities`].
    passages: Vec<(Entity, ContextParagraph)>,
}

/// A question, its answer and the entities whose passages hold the facts, hop by hop.
struct Question {
    text: String,
    answer: String,
    supporting: Vec<Entity>,
}

/// `n` tasks; difficulty 1 asks 1-hop questions only, 2 mixes both, 3 asks 2-hop only
/// (values outside 1..=3 are clamped). The same arguments give the same tasks.
pub fn generate(n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
    let difficulty = difficulty.clamp(1, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let kb = KnowledgeBase::random(&mut rng, n);
    let mut one_hop = kb.one_hop_questions();
    let mut two_hop = kb.two_hop_questions();
    one_hop.shuffle(&mut rng);
    two_hop.shuffle(&mut rng);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let wants_two_hop = match difficulty {
            1 => false,
            3 => true,
            _ => rng.gen_bool(0.5),
        };
        let pools = if wants_two_hop { [&mut two_hop, &mut one_hop] } else { [&mut one_hop, &mut two_hop] };
        let Some(question) = pools.into_iter().find_map(Vec::pop) else {
            break;
        };
        let id = format!("qa-gen-s{seed}-d{difficulty}-{i}");
        tasks.push(kb.task(question, id, &mut rng));
    }
    tasks
}

impl KnowledgeBase {
    /// A knowledge base large enough for `n` distinct questions of either kind.
    fn random(rng: &mut ChaCha8Rng, n: usize) -> Self {
        let mut names = HashSet::new();
        let cities: Vec<City> = (0..6 + n / 4)
            .map(|_| City {
                name: unique_name(rng, &mut names, city_name),
                population: rng.gen_range(20..20_000) * 100,
                founded: rng.gen_range(1100..1850),
            })
            .collect();
        let people: Vec<Person> = (0..10 + n)
            .map(|_| Person {
                name: unique_name(rng, &mut names, person_name),
                birth_year: rng.gen_range(1900..1990),
                occupation: OCCUPATIONS[rng.gen_range(0..OCCUPATIONS.len())],
                birth_city: rng.gen_range(0..cities.len()),
            })
            .collect();
        let companies: Vec<Company> = (0..4 + n / 2)
            .map(|_| {
                let founder = rng.gen_range(0..people.len());
                let ceo = (founder + rng.gen_range(1..people.len())) % people.len();
                Company {
                    name: unique_name(rng, &mut names, company_name),
                    founded: rng.gen_range(people[founder].birth_year + 20..=2020),
                    founder,
                    ceo,
                    headquarters: rng.gen_range(0..cities.len()),
                }
            })
            .collect();
        let mut kb = Self { people, cities, companies, passages: Vec::new() };
        kb.passages = kb.entities().into_iter().map(|e| (e, kb.render(e, rng))).collect();
        kb
    }

    fn entities(&self) -> Vec<Entity> {
        let people = (0..self.people.len()).map(Entity::Person);
        let cities = (0..self.cities.len()).map(Entity::City);
        let companies = (0..self.companies.len()).map(Entity::Company);
        people.chain(cities).chain(companies).collect()
    }

    fn name(&self, entity: Entity) -> &str {
        match entity {
            Entity::Person(i) => &self.people[i].name,
            Entity::City(i) => &self.cities[i].name,
            Entity::Company(i) => &self.companies[i].name,
        }
    }

    fn render(&self, entity: Entity, rng: &mut ChaCha8Rng) -> ContextParagraph {
        let variant = rng.gen_range(0..3);
        let text = match entity {
            Entity::Person(i) => self.person_text(i, variant),
            Entity::City(i) => city_text(&self.cities[i], variant),
            Entity::Company(i) => self.company_text(i, variant),
        };
        ContextParagraph { title: self.name(entity).to_string(), text }
    }

    fn person_text(&self, i: usize, variant: u32) -> String {
        let p = &self.people[i];
        let (name, year, job, city) = (&p.name, p.birth_year, p.occupation, &self.cities[p.birth_city].name);
        let surname = name.rsplit(' ').next().unwrap_or(name);
        let mut text = match variant {
            0 => format!("{name} (born {year} in {city}) is a {job}."),
            1 => format!("{name} is a {job}. {surname} was born in {year} in the city of {city}."),
            _ => format!("Born in {city} in {year}, {name} became a well-known {job}."),
        };
        for company in self.companies.iter().filter(|c| c.founder == i) {
            text.push_str(&format!(" {surname} founded {} in {}.", company.name, company.founded));
        }
        text
    }

    fn company_text(&self, i: usize, variant: u32) -> String {
        let c = &self.companies[i];
        let (name, year) = (&c.name, c.founded);
        let founder = &self.people[c.founder].name;
        let ceo = &self.people[c.ceo].name;
        let city = &self.cities[c.headquarters].name;
        match variant {
            0 => format!("{name} is a company founded in {year} by {founder}. It is headquartered in {city}, and its CEO is {ceo}."),
            1 => format!("{founder} founded {name} in {year}. The company has its headquarters in {city}. {ceo} serves as chief executive officer (CEO)."),
            _ => format!("Headquartered in {city}, {name} was established in {year} by {founder}. Its current CEO is {ceo}."),
        }
    }

    fn one_hop_questions(&self) -> Vec<Question> {
        let mut questions = Vec::new();
        for (i, p) in self.people.iter().enumerate() {
            let about = vec![Entity::Person(i)];
            let name = &p.name;
            questions.push(question(
                format!("In which city was {name} born?"),
                &self.cities[p.birth_city].name,
                &about,
            ));
            questions.push(question(format!("In what year was {name} born?"), &p.birth_year.to_string(), &about));
            questions.push(question(format!("What is the occupation of {name}?"), p.occupation, &about));
        }
        for (i, c) in self.companies.iter().enumerate() {
            let about = vec![Entity::Company(i)];
            let name = &c.name;
            questions.push(question(format!("In what year was {name} founded?"), &c.founded.to_string(), &about));
            questions.push(question(format!("Who founded {name}?"), &self.people[c.founder].name, &about));
            questions.push(question(
                format!("In which city is {name} headquartered?"),
                &self.cities[c.headquarters].name,
                &about,
            ));
            questions.push(question(format!("Who is the CEO of {name}?"), &self.people[c.ceo].name, &about));
        }
        for (i, c) in self.cities.iter().enumerate() {
            let about = vec![Entity::City(i)];
            let name = &c.name;
            questions.push(question(
                format!("What is the population of {name}?"),
                &with_thousands(c.population),
                &about,
            ));
            questions.push(question(format!("In what year was {name} founded?"), &c.founded.to_string(), &about));
        }
        questions
    }

    fn two_hop_questions(&self) -> Vec<Question> {
        let mut questions = Vec::new();
        for (i, c) in self.companies.iter().enumerate() {
            let name = &c.name;
            let (founder, ceo, hq) = (&self.people[c.founder], &self.people[c.ceo], &self.cities[c.headquarters]);
            let via_founder = [Entity::Company(i), Entity::Person(c.founder)];
            let via_ceo = [Entity::Company(i), Entity::Person(c.ceo)];
            let via_hq = [Entity::Company(i), Entity::City(c.headquarters)];
            questions.push(question(
                format!("In what year was the founder of {name} born?"),
                &founder.birth_year.to_string(),
                &via_founder,
            ));
            questions.push(question(
                format!("In which city was the founder of {name} born?"),
                &self.cities[founder.birth_city].name,
                &via_founder,
            ));
            questions.push(question(format!("What is the occupation of the CEO of {name}?"), ceo.occupation, &via_ceo));
            questions.push(question(
                format!("What is the population of the city where {name} is headquartered?"),
                &with_thousands(hq.population),
                &via_hq,
            ));
        }
        for (i, p) in self.people.iter().enumerate() {
            let city = &self.cities[p.birth_city];
            let via_city = [Entity::Person(i), Entity::City(p.birth_city)];
            questions.push(question(
                format!("In what year was the city where {} was born founded?", p.name),
                &city.founded.to_string(),
                &via_city,
            ));
        }
        questions
    }

    /// The task for a question: its supporting passages and random distractors, shuffled.
    fn task(&self, question: Question, id: String, rng: &mut ChaCha8Rng) -> Task {
        let is_supporting = |entity: &Entity| question.supporting.contains(entity);
        let supporting = self.passages.iter().filter(|(e, _)| is_supporting(e));
        let others: Vec<_> = self.passages.iter().filter(|(e, _)| !is_supporting(e)).collect();
        let distractors = others.choose_multiple(rng, CONTEXT_PARAGRAPHS.saturating_sub(question.supporting.len()));
        let mut context: Vec<ContextParagraph> =
            supporting.chain(distractors.copied()).map(|(_, p)| p.clone()).collect();
        context.shuffle(rng);
        let kind = if question.supporting.len() == 1 { "single-hop" } else { "bridge" };
        QaPayload {
            question: question.text,
            answers: vec![question.answer],
            source: Source::Generated,
            kind: Some(kind.to_string()),
            level: None,
            context,
            supporting_titles: question.supporting.iter().map(|e| self.name(*e).to_string()).collect(),
        }
        .into_task(id)
    }
}

fn question(text: String, answer: &str, supporting: &[Entity]) -> Question {
    Question { text, answer: answer.to_string(), supporting: supporting.to_vec() }
}

fn city_text(c: &City, variant: u32) -> String {
    let (name, year, population) = (&c.name, c.founded, with_thousands(c.population));
    match variant {
        0 => {
            format!("{name} is a city with a population of {population}. It was founded in {year}.")
        }
        1 => format!("Founded in {year}, {name} is a city of {population} inhabitants."),
        _ => {
            format!("{name} is a city that was founded in {year}; its population is {population}.")
        }
    }
}

/// A name not used before in this knowledge base.
fn unique_name(rng: &mut ChaCha8Rng, used: &mut HashSet<String>, make: fn(&mut ChaCha8Rng) -> String) -> String {
    loop {
        let name = make(rng);
        if used.insert(name.clone()) {
            return name;
        }
    }
}

fn person_name(rng: &mut ChaCha8Rng) -> String {
    let syllables = rng.gen_range(2..=3);
    format!("{} {}", word(rng, 2), word(rng, syllables))
}

fn city_name(rng: &mut ChaCha8Rng) -> String {
    word(rng, 3)
}

fn company_name(rng: &mut ChaCha8Rng) -> String {
    let kind = COMPANY_KINDS[rng.gen_range(0..COMPANY_KINDS.len())];
    format!("{} {kind}", word(rng, 2))
}

/// A capitalised word of `syllables` consonant-vowel-consonant syllables.
fn word(rng: &mut ChaCha8Rng, syllables: usize) -> String {
    let mut word = String::new();
    for _ in 0..syllables {
        for part in [&ONSETS[..], &VOWELS[..], &CODAS[..]] {
            word.push_str(part[rng.gen_range(0..part.len())]);
        }
    }
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => word,
    }
}

/// 1234567 -> "1,234,567".
fn with_thousands(n: u32) -> String {
    let digits: Vec<char> = n.to_string().chars().collect();
    let groups: Vec<String> = digits.rchunks(3).rev().map(|group| group.iter().collect()).collect();
    groups.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(with_thousands(7), "7");
        assert_eq!(with_thousands(1000), "1,000");
        assert_eq!(with_thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn two_hop_answers_sit_in_the_second_passage() {
        for task in generate(40, 3, 3) {
            let payload = QaPayload::from_task(&task).expect("generated payload");
            assert_eq!(payload.supporting_titles.len(), 2, "{}", payload.question);
            let second = payload
                .context
                .iter()
                .find(|p| p.title == payload.supporting_titles[1])
                .expect("second hop in context");
            assert!(second.text.contains(&payload.answers[0]), "{} -> {}", payload.question, payload.answers[0]);
            assert!(payload.question.contains(&payload.supporting_titles[0]));
        }
    }
}
