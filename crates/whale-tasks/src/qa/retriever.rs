//! BM25 retrieval over a passage corpus with tantivy, in RAM or on disk.
//!
//! Questions are free text full of quotes, colons and parentheses, so they never go through a
//! query syntax: the question is run through the index's own analyzer and each resulting term
//! becomes an optional clause over title and text, which is plain BM25 over the bag of words.
//! An on-disk index is reused only while a fingerprint of the exact passages it was built from
//! matches; the fingerprint file is removed before a rebuild and written after the commit, so
//! an interrupted build is never mistaken for a complete one.

use super::corpus::Passage;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

/// The analyzer of title and text: words, lowercased, English stop words dropped, stemmed.
const ANALYZER: &str = "whale_qa_en";
/// Changes whenever the schema or the analyzer changes, so that old indexes get rebuilt.
const INDEX_FORMAT: &str = "whale-qa-bm25 v1";
/// The file in an index directory that holds the fingerprint of the indexed passages.
pub const FINGERPRINT_FILE: &str = "whale-corpus.sha256";
const WRITER_MEMORY_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum QaError {
    #[error("search index: {0}")]
    Index(#[from] tantivy::TantivyError),
    #[error("cannot open index directory: {0}")]
    Directory(#[from] tantivy::directory::error::OpenDirectoryError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("stored passage lacks its `{0}` field; the index directory was not built by whale")]
    IncompleteDocument(&'static str),
}

/// One search result.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hit {
    pub id: String,
    pub title: String,
    pub text: String,
    pub score: f32,
}

/// Whether [`Retriever::open_or_build`] found an up-to-date index or had to (re)build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexOrigin {
    Built,
    Reused,
}

#[derive(Debug, Clone, Copy)]
struct Fields {
    id: Field,
    title: Field,
    text: Field,
}

/// A BM25 index over a fixed set of passages.
pub struct Retriever {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    origin: IndexOrigin,
}

impl Retriever {
    /// Builds an index in memory.
    pub fn in_memory(passages: &[Passage]) -> Result<Self, QaError> {
        let (schema, fields) = schema();
        let index = Index::create_in_ram(schema);
        register_analyzer(&index);
        write_passages(&index, fields, passages)?;
        Self::from_index(index, fields, IndexOrigin::Built)
    }

    /// Opens the index in `dir` if it was built from exactly these passages (same fingerprint, same
    /// document count), else (re)builds it there.
    pub fn open_or_build(passages: &[Passage], dir: &Path) -> Result<Self, QaError> {
        std::fs::create_dir_all(dir).map_err(|source| QaError::Io { path: dir.to_path_buf(), source })?;
        let (schema, fields) = schema();
        let index = Index::open_or_create(MmapDirectory::open(dir)?, schema)?;
        register_analyzer(&index);
        let fingerprint_path = dir.join(FINGERPRINT_FILE);
        let fingerprint = fingerprint(passages);
        let stored = std::fs::read_to_string(&fingerprint_path).ok();
        if stored.as_deref().map(str::trim) == Some(fingerprint.as_str()) {
            let reused = Self::from_index(index.clone(), fields, IndexOrigin::Reused)?;
            if reused.len() == passages.len() as u64 {
                return Ok(reused);
            }
        }
        if stored.is_some() {
            remove_file(&fingerprint_path)?;
        }
        write_passages(&index, fields, passages)?;
        std::fs::write(&fingerprint_path, format!("{fingerprint}\n"))
            .map_err(|source| QaError::Io { path: fingerprint_path, source })?;
        Self::from_index(index, fields, IndexOrigin::Built)
    }

    fn from_index(index: Index, fields: Fields, origin: IndexOrigin) -> Result<Self, QaError> {
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(Self { index, reader, fields, origin })
    }

    pub fn origin(&self) -> IndexOrigin {
        self.origin
    }

    /// The number of indexed passages.
    pub fn len(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `k` passages that score best for the query under BM25, best first. A query without
    /// a single indexable word finds nothing.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>, QaError> {
        let Some(query) = self.bag_of_words(query)? else {
            return Ok(Vec::new());
        };
        if k == 0 {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(k).order_by_score())?;
        top.into_iter()
            .map(|(score, address)| {
                let document: TantivyDocument = searcher.doc(address)?;
                self.hit(&document, score)
            })
            .collect()
    }

    fn bag_of_words(&self, query: &str) -> Result<Option<BooleanQuery>, QaError> {
        let mut analyzer = self.index.tokenizer_for_field(self.fields.text)?;
        let mut words: Vec<String> = Vec::new();
        analyzer.token_stream(query).process(&mut |token| {
            if !words.contains(&token.text) {
                words.push(token.text.clone());
            }
        });
        if words.is_empty() {
            return Ok(None);
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = words
            .iter()
            .flat_map(|word| [self.fields.title, self.fields.text].map(|field| (field, word)))
            .map(|(field, word)| {
                let term = TermQuery::new(Term::from_field_text(field, word), IndexRecordOption::WithFreqs);
                (Occur::Should, Box::new(term) as Box<dyn Query>)
            })
            .collect();
        Ok(Some(BooleanQuery::new(clauses)))
    }

    fn hit(&self, document: &TantivyDocument, score: f32) -> Result<Hit, QaError> {
        let text_of = |field: Field, name: &'static str| {
            document
                .get_first(field)
                .and_then(|value| value.as_str())
                .map(str::to_string)
                .ok_or(QaError::IncompleteDocument(name))
        };
        Ok(Hit {
            id: text_of(self.fields.id, "id")?,
            title: text_of(self.fields.title, "title")?,
            text: text_of(self.fields.text, "text")?,
            score,
        })
    }
}

fn schema() -> (Schema, Fields) {
    let analyzed = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default().set_tokenizer(ANALYZER).set_index_option(IndexRecordOption::WithFreqs),
        )
        .set_stored();
    let mut builder = Schema::builder();
    let fields = Fields {
        id: builder.add_text_field("id", STRING | STORED),
        title: builder.add_text_field("title", analyzed.clone()),
        text: builder.add_text_field("text", analyzed),
    };
    (builder.build(), fields)
}

fn register_analyzer(index: &Index) {
    let mut builder = TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .dynamic();
    if let Some(stop_words) = StopWordFilter::new(Language::English) {
        builder = builder.filter_dynamic(stop_words);
    }
    let analyzer = builder.filter_dynamic(Stemmer::new(Language::English)).build();
    index.tokenizers().register(ANALYZER, analyzer);
}

/// Replaces whatever the index holds by the passages, in one commit.
fn write_passages(index: &Index, fields: Fields, passages: &[Passage]) -> Result<(), QaError> {
    let mut writer: IndexWriter = index.writer_with_num_threads(1, WRITER_MEMORY_BYTES)?;
    writer.delete_all_documents()?;
    for passage in passages {
        let mut document = TantivyDocument::default();
        document.add_text(fields.id, &passage.id);
        document.add_text(fields.title, &passage.title);
        document.add_text(fields.text, &passage.text);
        writer.add_document(document)?;
    }
    writer.commit()?;
    writer.wait_merging_threads()?;
    Ok(())
}

/// SHA-256 over the index format and every passage, each field length-prefixed.
fn fingerprint(passages: &[Passage]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(INDEX_FORMAT.as_bytes());
    for passage in passages {
        for field in [&passage.id, &passage.title, &passage.text] {
            hasher.update((field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
    }
    hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

fn remove_file(path: &Path) -> Result<(), QaError> {
    std::fs::remove_file(path).map_err(|source| QaError::Io { path: path.to_path_buf(), source })
}
