//! A tiny element tree for the XML responses (EC2's query protocol, and CloudFormation's and
//! STS's awsQuery), serialized with quick-xml so escaping is never hand-rolled. EC2's SDK parser
//! is strict about scalars, so absent values are simply not added (see [`El::opt`]) instead of
//! being written as empty elements.

use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};

/// One XML element: a name, optional text and child elements.
#[derive(Debug, Clone)]
pub struct El {
    name: String,
    text: Option<String>,
    children: Vec<El>,
    xmlns: Option<&'static str>,
}

/// A list element `<name><item>..</item>..</name>`; each given element is renamed `item`.
pub fn set(name: &str, items: impl IntoIterator<Item = El>) -> El {
    el("x").list(name, items).children.remove(0)
}

/// An awsQuery list element `<name><member>..</member>..</name>`; each given element is renamed
/// `member`.
pub fn members(name: &str, items: impl IntoIterator<Item = El>) -> El {
    el("x").members(name, items).children.remove(0)
}

/// Starts an element.
pub fn el(name: &str) -> El {
    El {
        name: name.to_string(),
        text: None,
        children: Vec::new(),
        xmlns: None,
    }
}

impl El {
    /// A leaf element with text content.
    pub fn leaf(name: &str, text: impl ToString) -> El {
        let mut e = el(name);
        e.text = Some(text.to_string());
        e
    }

    /// Renames the element.
    pub fn rename(mut self, name: &str) -> El {
        self.name = name.to_string();
        self
    }

    /// Adds a child leaf.
    pub fn v(mut self, name: &str, text: impl ToString) -> El {
        self.children.push(El::leaf(name, text));
        self
    }

    /// Adds a child leaf only when the value is present.
    pub fn opt<T: ToString>(self, name: &str, text: Option<T>) -> El {
        match text {
            Some(t) => self.v(name, t),
            None => self,
        }
    }

    /// Adds a child element.
    pub fn child(mut self, child: El) -> El {
        self.children.push(child);
        self
    }

    /// Adds a wrapped list: `<name><item>..</item>..</name>`. Each given element is renamed `item`.
    pub fn list(mut self, name: &str, items: impl IntoIterator<Item = El>) -> El {
        let mut wrapper = el(name);
        for mut item in items {
            item.name = "item".to_string();
            wrapper.children.push(item);
        }
        self.children.push(wrapper);
        self
    }

    /// Adds an awsQuery list: `<name><member>..</member>..</name>`. Each given element is renamed
    /// `member`.
    pub fn members(mut self, name: &str, items: impl IntoIterator<Item = El>) -> El {
        let mut wrapper = el(name);
        for mut item in items {
            item.name = "member".to_string();
            wrapper.children.push(item);
        }
        self.children.push(wrapper);
        self
    }

    /// Adds a `tagSet` list from key/value pairs; omitted when there are no tags.
    pub fn tags<'a>(self, tags: impl IntoIterator<Item = (&'a String, &'a String)>) -> El {
        let items: Vec<El> = tags
            .into_iter()
            .map(|(k, v)| el("item").v("key", k).v("value", v))
            .collect();
        if items.is_empty() {
            self
        } else {
            self.list("tagSet", items)
        }
    }

    /// Renders a complete EC2 document with the XML declaration and the EC2 namespace.
    pub fn document(self) -> String {
        self.document_in("http://ec2.amazonaws.com/doc/2016-11-15/")
    }

    /// Renders a complete document with the XML declaration and the namespace `xmlns` on the
    /// root (an awsQuery service's, e.g. CloudFormation's).
    pub fn document_in(mut self, xmlns: &'static str) -> String {
        self.xmlns = Some(xmlns);
        let mut w = Writer::new(Vec::new());
        w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))
            .expect("writing to a Vec cannot fail");
        self.write(&mut w);
        String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8")
    }

    /// Renders without a declaration (error bodies).
    pub fn render(&self) -> String {
        let mut w = Writer::new(Vec::new());
        self.write(&mut w);
        String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8")
    }

    fn write(&self, w: &mut Writer<Vec<u8>>) {
        let mut start = BytesStart::new(self.name.as_str());
        if let Some(ns) = self.xmlns {
            start.push_attribute(("xmlns", ns));
        }
        if self.text.is_none() && self.children.is_empty() {
            w.write_event(Event::Empty(start)).expect("vec write");
            return;
        }
        w.write_event(Event::Start(start)).expect("vec write");
        if let Some(t) = &self.text {
            w.write_event(Event::Text(BytesText::new(t)))
                .expect("vec write");
        }
        for c in &self.children {
            c.write(w);
        }
        w.write_event(Event::End(BytesEnd::new(self.name.as_str())))
            .expect("vec write");
    }
}
