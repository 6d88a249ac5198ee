//! The shared implementation of `#[test]` and `#[main]`.
//!
//! Everything here works on `proc_macro2` types so that it can be unit tested
//! outside of a macro invocation.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream, Parser};
use syn::{
    Attribute, Error, GenericArgument, LitBool, LitInt, LitStr, Path, PathArguments, ReturnType,
    Signature, Type, Visibility, braced, token,
};

/// Which attribute is being expanded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `#[rdma_async::test]`
    Test,
    /// `#[rdma_async::main]`
    Main,
}

impl Kind {
    /// The arguments the attribute accepts, in the order error messages list
    /// them.
    fn options(self) -> &'static [&'static str] {
        match self {
            Kind::Test => &["flavor", "worker_threads", "require_device", "crate"],
            Kind::Main => &["flavor", "worker_threads", "crate"],
        }
    }

    /// How error messages refer to the annotated function.
    fn role(self) -> &'static str {
        match self {
            Kind::Test => "test function",
            Kind::Main => "main function",
        }
    }
}

/// Which Tokio runtimes the caller's `rdma-async` can build: the multi-thread one needs its
/// `rt-multi-thread` feature (on by default), which `rdma_async` tells by re-exporting either
/// `main`/`test` or `main_rt`/`test_rt` under those names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runtimes {
    /// Current-thread and multi-thread.
    All,
    /// Current-thread only.
    CurrentThreadOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

/// Attribute arguments after validation.
struct Config {
    flavor: Flavor,
    worker_threads: Option<usize>,
    require_device: bool,
    krate: Path,
}

/// Attribute arguments as written. They are checked against each other only
/// once all are known, because `worker_threads` may come before `flavor`.
#[derive(Default)]
struct Args {
    /// The key is kept to point a missing-feature error at it.
    flavor: Option<(Flavor, Path)>,
    /// The key is kept to point the flavor-mismatch error at it.
    worker_threads: Option<(usize, Path)>,
    require_device: Option<bool>,
    krate: Option<Path>,
}

impl Args {
    fn parse(kind: Kind, runtimes: Runtimes, tokens: TokenStream) -> syn::Result<Config> {
        let mut args = Args::default();
        syn::meta::parser(|meta| args.parse_one(kind, &meta)).parse2(tokens)?;
        args.finish(kind, runtimes)
    }

    fn parse_one(&mut self, kind: Kind, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let key = path_name(&meta.path);
        match key.as_str() {
            "flavor" => {
                let lit: LitStr = meta.value()?.parse()?;
                let flavor = match lit.value().as_str() {
                    "current_thread" => Flavor::CurrentThread,
                    "multi_thread" => Flavor::MultiThread,
                    other => {
                        return Err(Error::new_spanned(
                            &lit,
                            format!(
                                "unknown runtime flavor `{other}`; \
                                 expected `current_thread` or `multi_thread`"
                            ),
                        ));
                    }
                };
                set_once(&mut self.flavor, (flavor, meta.path.clone()), &meta.path)
            }
            "worker_threads" => {
                let lit: LitInt = meta.value()?.parse()?;
                let threads: usize = lit.base10_parse()?;
                if threads == 0 {
                    return Err(Error::new_spanned(
                        &lit,
                        "`worker_threads` must be at least 1",
                    ));
                }
                set_once(
                    &mut self.worker_threads,
                    (threads, meta.path.clone()),
                    &meta.path,
                )
            }
            "require_device" if kind == Kind::Test => {
                let lit: LitBool = meta.value()?.parse()?;
                set_once(&mut self.require_device, lit.value(), &meta.path)
            }
            "crate" => {
                let lit: LitStr = meta.value()?.parse()?;
                let path = lit.parse::<Path>().map_err(|_| {
                    Error::new_spanned(
                        &lit,
                        format!(
                            "`crate` must be a path to the rdma_async crate, \
                             such as `crate = \"::rdma_async\"`; found `{}`",
                            lit.value()
                        ),
                    )
                })?;
                set_once(&mut self.krate, path, &meta.path)
            }
            _ => {
                let expected: Vec<String> =
                    kind.options().iter().map(|o| format!("`{o}`")).collect();
                Err(Error::new_spanned(
                    &meta.path,
                    format!(
                        "Unknown attribute `{key}` is specified; expected one of: {}",
                        expected.join(", ")
                    ),
                ))
            }
        }
    }

    fn finish(self, kind: Kind, runtimes: Runtimes) -> syn::Result<Config> {
        // Tokio's defaults: `#[tokio::main]` builds a multi-thread runtime, `#[tokio::test]` a
        // current-thread one.
        let flavor = self
            .flavor
            .as_ref()
            .map(|(flavor, _)| *flavor)
            .unwrap_or(match kind {
                Kind::Main => Flavor::MultiThread,
                Kind::Test => Flavor::CurrentThread,
            });
        if flavor == Flavor::MultiThread && runtimes == Runtimes::CurrentThreadOnly {
            let message = match &self.flavor {
                Some(_) => {
                    "the multi_thread flavor needs rdma-async's `rt-multi-thread` feature \
                     (on by default); enable it, or use `flavor = \"current_thread\"`"
                }
                None => {
                    "the default flavor of `main` is multi_thread, which needs rdma-async's \
                     `rt-multi-thread` feature (on by default); enable it, or use \
                     `flavor = \"current_thread\"`"
                }
            };
            return Err(match &self.flavor {
                Some((_, key)) => Error::new_spanned(key, message),
                None => Error::new(Span::call_site(), message),
            });
        }
        if let Some((_, key)) = &self.worker_threads
            && flavor != Flavor::MultiThread
        {
            return Err(Error::new_spanned(
                key,
                "the `worker_threads` option requires `flavor = \"multi_thread\"`; \
                 the current_thread runtime runs everything on the calling thread",
            ));
        }
        Ok(Config {
            flavor,
            worker_threads: self.worker_threads.map(|(threads, _)| threads),
            require_device: self.require_device.unwrap_or(false),
            krate: self
                .krate
                .unwrap_or_else(|| syn::parse_quote!(::rdma_async)),
        })
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, key: &Path) -> syn::Result<()> {
    if slot.is_some() {
        return Err(Error::new_spanned(
            key,
            format!("`{}` is specified more than once", path_name(key)),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// `a::b` for a path, ignoring generic arguments (argument keys have none).
fn path_name(path: &Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let prefix = if path.leading_colon.is_some() {
        "::"
    } else {
        ""
    };
    format!("{prefix}{}", segments.join("::"))
}

/// An `fn` item whose body is kept as unparsed tokens.
///
/// The macro never needs to look inside the body, and not parsing its
/// statements keeps expansion cheap for large test bodies.
struct EntryFn {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    brace: token::Brace,
    inner_attrs: Vec<Attribute>,
    stmts: TokenStream,
}

impl Parse for EntryFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let content;
        let brace = braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let stmts = content.parse()?;
        Ok(EntryFn {
            attrs,
            vis,
            sig,
            brace,
            inner_attrs,
            stmts,
        })
    }
}

impl EntryFn {
    /// The body as a brace-delimited block, keeping the original brace span
    /// so type errors about the block point at the user's code.
    fn body(&self) -> TokenStream {
        let mut body = TokenStream::new();
        self.brace
            .surround(&mut body, |tokens| self.stmts.to_tokens(tokens));
        body
    }
}

/// What a skipped test returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestReturn {
    Unit,
    Result,
}

/// Collects independent errors so one build reports all of them.
#[derive(Default)]
struct Errors(Option<Error>);

impl Errors {
    fn push(&mut self, error: Error) {
        match &mut self.0 {
            Some(existing) => existing.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Expands `#[test]` or `#[main]`.
///
/// On error the function is still emitted next to the `compile_error!`, so
/// that it exists for name resolution and IDE tooling: as written for a
/// test, and as a synchronous stub for a parameterless `main` (see
/// [`main_error_stub`]).
pub(crate) fn expand(
    kind: Kind,
    runtimes: Runtimes,
    args: TokenStream,
    item: TokenStream,
) -> TokenStream {
    match try_expand(kind, runtimes, args, item.clone()) {
        Ok(expanded) => expanded,
        Err(error) => {
            let mut out = match (kind, syn::parse2::<EntryFn>(item.clone())) {
                // With parameters rustc's own "wrong type" error should point
                // at the user's signature, so only parameterless mains get a
                // stub.
                (Kind::Main, Ok(func)) if func.sig.inputs.is_empty() => main_error_stub(&func),
                _ => item,
            };
            out.extend(error.into_compile_error());
            out
        }
    }
}

/// `main` without `async`, its body kept inside an unused async block.
///
/// Emitting `async fn main` as written would add rustc's "`main` function is
/// not allowed to be `async`" to every error; the async block keeps the body
/// type-checked and `.await` valid without that noise.
fn main_error_stub(func: &EntryFn) -> TokenStream {
    let EntryFn {
        attrs,
        vis,
        inner_attrs,
        ..
    } = func;
    let mut sig = func.sig.clone();
    sig.asyncness = None;
    let body = func.body();
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let _ = async #body;
            ::core::unimplemented!("`#[rdma_async::main]` failed to expand")
        }
    }
}

fn try_expand(
    kind: Kind,
    runtimes: Runtimes,
    args: TokenStream,
    item: TokenStream,
) -> syn::Result<TokenStream> {
    let config = Args::parse(kind, runtimes, args);
    let func = syn::parse2::<EntryFn>(item);
    let mut errors = Errors::default();
    if let Err(error) = &config {
        errors.push(error.clone());
    }
    let returns = match &func {
        Ok(func) => check_fn(kind, func, &mut errors),
        Err(error) => {
            errors.push(error.clone());
            TestReturn::Unit
        }
    };
    errors.finish()?;
    let (config, func) = (config?, func?);
    Ok(match kind {
        Kind::Test => expand_test(&config, &func, returns),
        Kind::Main => expand_main(&config, &func),
    })
}

/// Records every problem with the function's shape. For tests, also works
/// out what a skipped test returns.
fn check_fn(kind: Kind, func: &EntryFn, errors: &mut Errors) -> TestReturn {
    if func.sig.asyncness.is_none() {
        errors.push(Error::new_spanned(
            func.sig.fn_token,
            "the `async` keyword is missing from the function declaration",
        ));
    }
    if !func.sig.inputs.is_empty() {
        errors.push(Error::new_spanned(
            &func.sig.inputs,
            format!("the {} cannot accept arguments", kind.role()),
        ));
    }
    if kind == Kind::Main {
        return TestReturn::Unit;
    }
    if let Some(attr) = func.attrs.iter().find(|attr| is_test_attr(attr)) {
        errors.push(Error::new_spanned(
            attr,
            "second test attribute is supplied; `#[rdma_async::test]` already \
             makes this function a test, so remove this attribute",
        ));
    }
    classify_test_return(&func.sig.output).unwrap_or_else(|e| {
        errors.push(e);
        TestReturn::Unit
    })
}

/// Whether `attr` is some test attribute: `#[test]`, `#[tokio::test]`,
/// `#[rdma_async::test]`, `#[::core::prelude::v1::test]`, ...
///
/// Any of them next to ours would register the function twice or wrap an
/// already synchronous function.
fn is_test_attr(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|segment| segment.ident == "test")
}

/// Checks that a test returns `()` or `Result<(), E>`: the only types for
/// which a skipped test has an obvious passing value.
fn classify_test_return(output: &ReturnType) -> syn::Result<TestReturn> {
    match output {
        ReturnType::Default => Ok(TestReturn::Unit),
        ReturnType::Type(_, ty) => classify_test_type(ty),
    }
}

fn classify_test_type(ty: &Type) -> syn::Result<TestReturn> {
    let unsupported = || {
        Error::new_spanned(
            ty,
            "the return type of an `#[rdma_async::test]` function must be `()` or `Result<(), E>`",
        )
    };
    match ty {
        Type::Paren(inner) => classify_test_type(&inner.elem),
        Type::Group(inner) => classify_test_type(&inner.elem),
        _ if is_unit(ty) => Ok(TestReturn::Unit),
        Type::Path(path) if path.qself.is_none() => {
            let Some(last) = path.path.segments.last() else {
                return Err(unsupported());
            };
            if last.ident != "Result" {
                return Err(unsupported());
            }
            match &last.arguments {
                // An alias such as `std::fmt::Result` fixes `()` itself.
                PathArguments::None => Ok(TestReturn::Result),
                PathArguments::AngleBracketed(args) => match args.args.first() {
                    Some(GenericArgument::Type(ok)) if is_unit(ok) => Ok(TestReturn::Result),
                    Some(GenericArgument::Type(ok)) => Err(Error::new_spanned(
                        ok,
                        "the `Ok` type of an `#[rdma_async::test]` function's `Result` must be \
                         `()`, because a skipped test returns `Ok(())`",
                    )),
                    _ => Err(unsupported()),
                },
                PathArguments::Parenthesized(_) => Err(unsupported()),
            }
        }
        _ => Err(unsupported()),
    }
}

fn is_unit(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(inner) => is_unit(&inner.elem),
        Type::Group(inner) => is_unit(&inner.elem),
        _ => false,
    }
}

/// A local variable of the generated code.
///
/// Mixed-site hygiene hides it from the user's code, but not from the user's
/// items: a `const` or unit struct of the same name in scope would turn the
/// `let` into a pattern match, hence the unlikely name.
fn local(name: &str) -> Ident {
    Ident::new(&format!("__rdma_async_{name}"), Span::mixed_site())
}

/// `Builder::new_*()` configured from the arguments, without `.build()`.
fn runtime_builder(config: &Config) -> TokenStream {
    let krate = &config.krate;
    let builder = quote!(#krate::__private::tokio::runtime::Builder);
    match config.flavor {
        Flavor::CurrentThread => quote!(#builder::new_current_thread()),
        Flavor::MultiThread => {
            // Unsuffixed so that `worker_threads = 2u8` still passes a usize.
            let threads = config
                .worker_threads
                .map(Literal::usize_unsuffixed)
                .map(|n| quote!(.worker_threads(#n)));
            quote!(#builder::new_multi_thread() #threads)
        }
    }
}

fn expand_test(config: &Config, func: &EntryFn, returns: TestReturn) -> TokenStream {
    let krate = &config.krate;
    let EntryFn {
        attrs,
        vis,
        inner_attrs,
        ..
    } = func;
    let mut sig = func.sig.clone();
    sig.asyncness = None;
    let name = sig.ident.to_string();
    let output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => ty.to_token_stream(),
    };
    let skipped = match returns {
        TestReturn::Unit => quote!(),
        TestReturn::Result => quote!(::core::result::Result::Ok(())),
    };
    let required = if config.require_device {
        quote!(true)
    } else {
        quote!(#krate::__private::device_required_by_env())
    };
    // The name goes into the format strings now; identifiers never contain
    // braces, so this cannot add format placeholders.
    let required_msg = format!("RDMA device required for test `{name}` but {{}}");
    let skipped_msg = format!("skipped: no RDMA device ({{}}) \u{2014} {{}}::{name}\n");
    let builder = runtime_builder(config);
    let body = func.body();
    let reason = local("reason");
    let future = local("future");
    let runtime = local("runtime");

    quote! {
        #(#attrs)*
        #[::core::prelude::v1::test]
        #vis #sig {
            #(#inner_attrs)*
            if let ::core::result::Result::Err(#reason) = #krate::__private::rdma_device_check() {
                if #required {
                    ::core::panic!(#required_msg, #reason);
                }
                // Written to the stderr handle rather than with `eprintln!`,
                // which the test harness captures and drops for passing
                // tests: the skip has to be visible in a plain `cargo test`.
                let _ = ::std::io::Write::write_fmt(
                    &mut ::std::io::stderr(),
                    ::core::format_args!(#skipped_msg, #reason, ::core::module_path!()),
                );
                return #skipped;
            }
            // Erasing the future's type means every test shares one
            // `block_on` instantiation instead of compiling its own, and the
            // expected output type guides inference of `?` in the body.
            let #future: ::core::pin::Pin<
                &mut dyn ::core::future::Future<Output = #output>
            > = ::core::pin::pin!(async #body);
            #[allow(clippy::expect_used)]
            let #runtime = #builder
                .enable_all()
                .build()
                .expect("failed to build the Tokio runtime for this test");
            #runtime.block_on(#future)
        }
    }
}

fn expand_main(config: &Config, func: &EntryFn) -> TokenStream {
    let EntryFn {
        attrs,
        vis,
        inner_attrs,
        ..
    } = func;
    let mut sig = func.sig.clone();
    sig.asyncness = None;
    let builder = runtime_builder(config);
    let body = func.body();
    let runtime = local("runtime");

    // Unlike tests there is one `main` per binary, so the future is passed
    // as is; that also keeps `-> impl Termination` working.
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #[allow(clippy::expect_used)]
            let #runtime = #builder
                .enable_all()
                .build()
                .expect("failed to build the Tokio runtime");
            #runtime.block_on(async #body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(kind: Kind, args: TokenStream, item: TokenStream) -> String {
        expand(kind, Runtimes::All, args, item).to_string()
    }

    fn error_of(kind: Kind, args: TokenStream, item: TokenStream) -> String {
        error_with(kind, Runtimes::All, args, item)
    }

    fn error_with(kind: Kind, runtimes: Runtimes, args: TokenStream, item: TokenStream) -> String {
        match try_expand(kind, runtimes, args, item) {
            Ok(tokens) => panic!("expected an error, got `{tokens}`"),
            Err(error) => error
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[::core::prelude::v1::test]
    fn unit_test_expands_to_a_device_checked_test() {
        let out = expand_str(
            Kind::Test,
            quote!(),
            quote!(
                async fn probe() {}
            ),
        );
        assert!(out.contains(":: core :: prelude :: v1 :: test"), "{out}");
        assert!(out.contains("fn probe ()"), "{out}");
        assert!(!out.contains("async fn"), "{out}");
        assert!(out.contains(":: rdma_async :: __private :: rdma_device_check ()"));
        assert!(out.contains(":: rdma_async :: __private :: device_required_by_env ()"));
        assert!(out.contains("new_current_thread ()"), "{out}");
        assert!(out.contains("return ;"), "{out}");
    }

    #[::core::prelude::v1::test]
    fn result_test_returns_ok_when_skipped() {
        let out = expand_str(
            Kind::Test,
            quote!(),
            quote!(
                async fn probe() -> std::io::Result<()> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains("return :: core :: result :: Result :: Ok (())"),
            "{out}"
        );
    }

    #[::core::prelude::v1::test]
    fn arguments_are_applied() {
        let out = expand_str(
            Kind::Test,
            quote!(
                flavor = "multi_thread",
                worker_threads = 3u8,
                require_device = true,
                crate = "rdma"
            ),
            quote!(
                async fn probe() {}
            ),
        );
        assert!(out.contains("rdma :: __private :: tokio :: runtime :: Builder :: new_multi_thread () . worker_threads (3)"), "{out}");
        assert!(out.contains("if true"), "{out}");
        assert!(!out.contains("device_required_by_env"), "{out}");
        assert!(!out.contains(":: rdma_async"), "{out}");
    }

    #[::core::prelude::v1::test]
    fn crate_keyword_path_is_accepted() {
        // `crate = "crate"` is how rdma-async's own unit tests can use it.
        let out = expand_str(
            Kind::Test,
            quote!(crate = "crate"),
            quote!(
                async fn probe() {}
            ),
        );
        assert!(
            out.contains("crate :: __private :: rdma_device_check ()"),
            "{out}"
        );
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[::core::prelude::v1::test]
    fn main_has_no_device_check() {
        let out = expand_str(
            Kind::Main,
            quote!(),
            quote!(
                async fn main() {}
            ),
        );
        assert!(!out.contains("rdma_device_check"), "{out}");
        assert!(!out.contains("prelude :: v1 :: test"), "{out}");
        // `#[tokio::main]`'s default.
        assert!(out.contains("new_multi_thread ()"), "{out}");
    }

    #[::core::prelude::v1::test]
    fn main_takes_worker_threads_without_a_flavor() {
        let out = expand_str(
            Kind::Main,
            quote!(worker_threads = 2),
            quote!(
                async fn main() {}
            ),
        );
        assert!(
            out.contains("new_multi_thread () . worker_threads (2)"),
            "{out}"
        );
    }

    #[::core::prelude::v1::test]
    fn without_the_multi_thread_runtime_only_current_thread_expands() {
        let main = quote!(
            async fn main() {}
        );
        let test = quote!(
            async fn t() {}
        );
        let only = Runtimes::CurrentThreadOnly;
        let default_main = error_with(Kind::Main, only, quote!(), main.clone());
        assert!(default_main.contains("the default flavor of `main` is multi_thread"));
        let explicit = error_with(
            Kind::Test,
            only,
            quote!(flavor = "multi_thread"),
            test.clone(),
        );
        assert!(explicit.contains("needs rdma-async's `rt-multi-thread` feature"));
        for (kind, item) in [(Kind::Main, main), (Kind::Test, test)] {
            let out = expand(kind, only, quote!(flavor = "current_thread"), item).to_string();
            assert!(out.contains("new_current_thread ()"), "{out}");
            assert!(!out.contains("compile_error"), "{out}");
        }
    }

    #[::core::prelude::v1::test]
    fn errors_are_reported() {
        let cases: &[(Kind, TokenStream, TokenStream, &str)] = &[
            (
                Kind::Test,
                quote!(),
                quote!(
                    fn t() {}
                ),
                "the `async` keyword is missing from the function declaration",
            ),
            (
                Kind::Test,
                quote!(),
                quote!(
                    async fn t(x: u8) {}
                ),
                "the test function cannot accept arguments",
            ),
            (
                Kind::Main,
                quote!(),
                quote!(
                    async fn main(x: u8) {}
                ),
                "the main function cannot accept arguments",
            ),
            (
                Kind::Test,
                quote!(threads = 2),
                quote!(
                    async fn t() {}
                ),
                "Unknown attribute `threads` is specified; expected one of: `flavor`, \
                 `worker_threads`, `require_device`, `crate`",
            ),
            (
                Kind::Main,
                quote!(require_device = true),
                quote!(
                    async fn main() {}
                ),
                "Unknown attribute `require_device` is specified; expected one of: `flavor`, \
                 `worker_threads`, `crate`",
            ),
            (
                Kind::Test,
                quote!(worker_threads = 2),
                quote!(
                    async fn t() {}
                ),
                "the `worker_threads` option requires `flavor = \"multi_thread\"`",
            ),
            (
                Kind::Test,
                quote!(flavor = "multi_thread", worker_threads = 0),
                quote!(
                    async fn t() {}
                ),
                "`worker_threads` must be at least 1",
            ),
            (
                Kind::Test,
                quote!(flavor = "single"),
                quote!(
                    async fn t() {}
                ),
                "unknown runtime flavor `single`",
            ),
            (
                Kind::Test,
                quote!(require_device = true, require_device = false),
                quote!(
                    async fn t() {}
                ),
                "`require_device` is specified more than once",
            ),
            (
                Kind::Test,
                quote!(crate = "not a path"),
                quote!(
                    async fn t() {}
                ),
                "`crate` must be a path",
            ),
            (
                Kind::Test,
                quote!(),
                quote!(
                    async fn t() -> u32 {
                        0
                    }
                ),
                "must be `()` or `Result<(), E>`",
            ),
            (
                Kind::Test,
                quote!(),
                quote!(
                    async fn t() -> Result<u32, ()> {
                        Ok(0)
                    }
                ),
                "the `Ok` type",
            ),
            (
                Kind::Test,
                quote!(),
                quote!(
                    #[test]
                    async fn t() {}
                ),
                "second test attribute is supplied",
            ),
        ];
        for (kind, args, item, expected) in cases {
            let error = error_of(*kind, args.clone(), item.clone());
            assert!(
                error.contains(expected),
                "{item}: expected `{expected}` in `{error}`"
            );
        }
    }

    #[::core::prelude::v1::test]
    fn independent_errors_are_combined() {
        let error = error_of(
            Kind::Test,
            quote!(bogus),
            quote!(
                fn t(x: u8) -> u32 {
                    0
                }
            ),
        );
        assert!(error.contains("Unknown attribute `bogus`"), "{error}");
        assert!(error.contains("`async` keyword is missing"), "{error}");
        assert!(error.contains("cannot accept arguments"), "{error}");
        assert!(error.contains("must be `()` or `Result<(), E>`"), "{error}");
    }

    #[::core::prelude::v1::test]
    fn accepted_return_types() {
        for item in [
            quote!(
                async fn t() -> () {}
            ),
            quote!(
                async fn t() -> (()) {}
            ),
            quote!(
                async fn t() -> Result<(), String> {
                    Ok(())
                }
            ),
            quote!(
                async fn t() -> ::std::result::Result<(), Box<dyn std::error::Error>> {
                    Ok(())
                }
            ),
            quote!(
                async fn t() -> anyhow::Result<()> {
                    Ok(())
                }
            ),
            quote!(
                async fn t() -> std::fmt::Result {
                    Ok(())
                }
            ),
        ] {
            assert!(
                try_expand(Kind::Test, Runtimes::All, quote!(), item.clone()).is_ok(),
                "{item}"
            );
        }
    }

    #[::core::prelude::v1::test]
    fn original_item_is_kept_on_error() {
        let out = expand_str(
            Kind::Test,
            quote!(),
            quote!(
                fn kept() {}
            ),
        );
        assert!(out.starts_with("fn kept () { }"), "{out}");
        assert!(out.contains("compile_error"), "{out}");
    }
}
