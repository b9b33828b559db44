//! Plain-text tables and the small formatting helpers the commands share.

use std::time::Duration;

/// Rows of text printed as left-aligned columns separated by two spaces.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut text = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[c] - cell.chars().count() + 2;
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

/// Key-value lines, keys aligned: `name:        orders`.
pub(crate) fn render_fields(fields: &[(&str, String)]) -> String {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    fields
        .iter()
        .map(|(key, value)| format!("{:<width$}  {value}\n", format!("{key}:")))
        .collect()
}

/// RFC 3339 UTC with milliseconds, or the raw number when it is out of range.
pub(crate) fn time_text(time_ms: i64) -> String {
    crate::time::rfc3339_millis(time_ms).unwrap_or_else(|| format!("{time_ms}ms"))
}

/// A time for JSON: an RFC 3339 string, or the raw milliseconds when out of range.
pub(crate) fn time_json(time_ms: i64) -> serde_json::Value {
    match crate::time::rfc3339_millis(time_ms) {
        Some(text) => serde_json::Value::String(text),
        None => serde_json::Value::from(time_ms),
    }
}

pub(crate) fn duration_text(duration_ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(duration_ms)).to_string()
}

/// Partition ids in numeric order when they are numbers ("2" before "10").
pub(crate) fn sort_partition_ids(ids: &mut [String]) {
    ids.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new(&["NAME", "PARTITIONS"]);
        table.row(vec!["orders".into(), "4".into()]);
        table.row(vec!["a".into(), "32".into()]);
        assert_eq!(
            table.render(),
            "NAME    PARTITIONS\norders  4\na       32\n"
        );
    }

    #[test]
    fn fields_align_keys() {
        let text = render_fields(&[("name", "x".into()), ("partitions", "4".into())]);
        assert_eq!(text, "name:        x\npartitions:  4\n");
    }

    #[test]
    fn partition_ids_sort_numerically() {
        let mut ids = vec!["10".to_owned(), "2".to_owned(), "1".to_owned()];
        sort_partition_ids(&mut ids);
        assert_eq!(ids, ["1", "2", "10"]);
    }
}
